//! The rewrite rules, in named tables grouped by theme. Every rule applies
//! through [`Typed`]: the right-hand side is instantiated only if every new
//! node type-checks (by the graph dialect's own inference) and the result has
//! the type of the matched class, so no rule can make an ill-typed term.
//! Rules whose right-hand side needs computed attributes (a composed
//! permutation, a shifted slice) compute its text from the match.
//!
//! # The tables
//!
//! - **Rules** (`rules.rs`), named tables of kebab-named rules, most in both directions
//!   (`-rev`): `algebra` (commutativity, associativity, distributivity of `+`/`*`,
//!   `a - b = a + (-b)`, `-(-x)`, `x * sigmoid(x) = silu(x)`), `layout` (transpose composition, transposes through
//!   element-wise ops and products), `matmul` (associativity, distribution over `+`,
//!   scalar factors), `conv` (bilinearity in input and weights, batchnorm and per-channel
//!   scales of the output, or of one image's input, folded into the weights), `split-concat` (slices of concatenations and of
//!   slices, whole slices, adjacent slices, concatenation and slices commuting with
//!   element-wise ops), and the multi-pattern `merge` table (products sharing their left
//!   or right operand, convolutions sharing their input, become one op on concatenated
//!   operands and slices). Every rule applies through one applier that instantiates the
//!   right-hand side only if each new node type-checks and the result has the matched
//!   class's type; conditions exclude the broadcasting cases where a law would type-check
//!   and still be false (distribution of a product over a broadcast sum). Rules whose
//!   right-hand side needs computed attributes compute its text from the match.
//!   Relu after a convolution needs no rule: the CPU back end applies it in the
//!   convolution's epilogue, and the cost model prices it so.

use std::str::FromStr;

use dlc_core::{DType, TensorType};
use egg::{
    Applier, ENodeOrVar, Id, Language, MultiPattern, Pattern, PatternAst, Rewrite, Searcher, Subst,
    Symbol, Var,
};

use super::lang::{Data, TEGraph, TLang, TensorAnalysis, compute_data, list, parse_list};
use crate::ops::ConstValue;

/// A rewrite rule of the term language.
pub type Rule = Rewrite<TLang, TensorAnalysis>;

type Cond = fn(&TEGraph, &Subst) -> bool;
type Computed = fn(&mut TEGraph, &Subst) -> Option<String>;
type MultiComputed = fn(&mut TEGraph, &Subst) -> Option<Vec<(&'static str, String)>>;

enum Rhs {
    Pattern(PatternAst<TLang>),
    Computed(Computed),
    Multi(MultiComputed),
}

/// The applier of every rule: optional condition, then type-checked
/// instantiation of the right-hand side.
pub struct Typed {
    rhs: Rhs,
    cond: Option<Cond>,
}

fn pattern(text: &str) -> Pattern<TLang> {
    Pattern::from_str(text).unwrap_or_else(|e| panic!("malformed pattern `{text}`: {e}"))
}

fn var(text: &str) -> Var {
    Var::from_str(text).unwrap_or_else(|e| panic!("malformed variable `{text}`: {e}"))
}

/// Adds `ast` under `subst` and unions it with `target`, if every new node
/// type-checks and the result has `target`'s type. Adds nothing otherwise.
pub fn instantiate(
    eg: &mut TEGraph,
    ast: &PatternAst<TLang>,
    subst: &Subst,
    target: Id,
) -> Option<Id> {
    let nodes = ast.as_ref();
    let mut data: Vec<Data> = Vec::with_capacity(nodes.len());
    for n in nodes {
        let d = match n {
            ENodeOrVar::Var(v) => eg[*subst.get(*v)?].data.clone(),
            ENodeOrVar::ENode(node) => {
                compute_data(&eg.analysis.tables, node, &|c| data[usize::from(c)].clone())
            }
        };
        if d == Data::Invalid {
            return None;
        }
        data.push(d);
    }
    if data.last()?.ty()? != eg[target].data.ty()? {
        return None;
    }
    let mut ids: Vec<Id> = Vec::with_capacity(nodes.len());
    for n in nodes {
        let id = match n {
            ENodeOrVar::Var(v) => *subst.get(*v)?,
            ENodeOrVar::ENode(node) => {
                let node = node.clone().map_children(|c| ids[usize::from(c)]);
                eg.add(node)
            }
        };
        ids.push(id);
    }
    let root = *ids.last()?;
    eg.union(target, root).then_some(root)
}

impl Applier<TLang, TensorAnalysis> for Typed {
    fn apply_one(
        &self,
        eg: &mut TEGraph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<TLang>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        if let Some(cond) = self.cond
            && !cond(eg, subst)
        {
            return vec![];
        }
        // A settled class was rewritten by these rules where it came from
        // (its callee, saturated before inlining); merges across classes
        // (multi-pattern rules) may still find something new.
        if !matches!(self.rhs, Rhs::Multi(_)) && eg.analysis.settled.contains(&eg.find(eclass)) {
            return vec![];
        }
        match &self.rhs {
            Rhs::Pattern(ast) => instantiate(eg, ast, subst, eclass).into_iter().collect(),
            Rhs::Computed(f) => match f(eg, subst) {
                Some(text) => instantiate(eg, &pattern(&text).ast, subst, eclass)
                    .into_iter()
                    .collect(),
                None => vec![],
            },
            Rhs::Multi(f) => {
                let Some(parts) = f(eg, subst) else {
                    return vec![];
                };
                let mut changed = vec![];
                for (target, text) in parts {
                    let Some(&target) = subst.get(var(target)) else {
                        continue;
                    };
                    changed.extend(instantiate(eg, &pattern(&text).ast, subst, target));
                }
                changed
            }
        }
    }
}

fn rule(
    name: &str,
    searcher: impl Searcher<TLang, TensorAnalysis> + Send + Sync + 'static,
    rhs: Rhs,
    cond: Option<Cond>,
) -> Rule {
    Rewrite::new(name, searcher, Typed { rhs, cond })
        .unwrap_or_else(|e| panic!("rule `{name}`: {e}"))
}

fn rw(name: &str, lhs: &str, rhs: &str) -> Rule {
    rule(name, pattern(lhs), Rhs::Pattern(pattern(rhs).ast), None)
}

fn rw_if(name: &str, lhs: &str, rhs: &str, cond: Cond) -> Rule {
    rule(
        name,
        pattern(lhs),
        Rhs::Pattern(pattern(rhs).ast),
        Some(cond),
    )
}

/// Both directions: `name` left to right, `name-rev` right to left.
fn bi(name: &str, lhs: &str, rhs: &str) -> [Rule; 2] {
    [rw(name, lhs, rhs), rw(&format!("{name}-rev"), rhs, lhs)]
}

fn bi_if(name: &str, lhs: &str, rhs: &str, cond: Cond) -> [Rule; 2] {
    [
        rw_if(name, lhs, rhs, cond),
        rw_if(&format!("{name}-rev"), rhs, lhs, cond),
    ]
}

fn computed(name: &str, lhs: &str, f: Computed) -> Rule {
    rule(name, pattern(lhs), Rhs::Computed(f), None)
}

fn multi(name: &str, lhs: &str, f: MultiComputed) -> Rule {
    let searcher = MultiPattern::<TLang>::from_str(lhs)
        .unwrap_or_else(|e| panic!("malformed multi-pattern `{lhs}`: {e}"));
    rule(name, searcher, Rhs::Multi(f), None)
}

fn ty<'a>(eg: &'a TEGraph, s: &Subst, v: &str) -> Option<&'a TensorType> {
    eg[*s.get(var(v))?].data.ty()
}

fn shape<'a>(eg: &'a TEGraph, s: &Subst, v: &str) -> Option<&'a [usize]> {
    ty(eg, s, v).map(|t| t.shape.as_slice())
}

fn num(eg: &TEGraph, s: &Subst, v: &str) -> Option<usize> {
    match eg[*s.get(var(v))?].data {
        Data::Num(n) => usize::try_from(n).ok(),
        _ => None,
    }
}

fn sym_list(eg: &TEGraph, s: &Subst, v: &str) -> Option<Vec<usize>> {
    match eg[*s.get(var(v))?].data {
        Data::Sym(sym) => parse_list(sym.as_str()),
        _ => None,
    }
}

fn same_shape(eg: &TEGraph, s: &Subst, a: &str, b: &str) -> bool {
    matches!((shape(eg, s, a), shape(eg, s, b)), (Some(x), Some(y)) if x == y)
}

/// Element-wise algebra: associativity, commutativity, distributivity.
pub fn algebra() -> Vec<Rule> {
    let mut r = vec![
        rw("add-comm", "(add ?a ?b)", "(add ?b ?a)"),
        rw("mul-comm", "(mul ?a ?b)", "(mul ?b ?a)"),
        rw("neg-neg", "(unary neg (unary neg ?x))", "?x"),
        // SiLU as exporters write it (ONNX has no Swish before opset 24):
        // one division where the product rounds twice, so a rule here, not
        // in `graph.canonicalize`, which keeps every result's rounding.
        rw(
            "mul-sigmoid-is-silu",
            "(mul ?x (unary sigmoid ?x))",
            "(unary silu ?x)",
        ),
        rw(
            "sigmoid-mul-is-silu",
            "(mul (unary sigmoid ?x) ?x)",
            "(unary silu ?x)",
        ),
    ];
    r.extend(bi(
        "add-assoc",
        "(add (add ?a ?b) ?c)",
        "(add ?a (add ?b ?c))",
    ));
    r.extend(bi(
        "mul-assoc",
        "(mul (mul ?a ?b) ?c)",
        "(mul ?a (mul ?b ?c))",
    ));
    r.extend(bi(
        "mul-distrib-add",
        "(mul ?a (add ?b ?c))",
        "(add (mul ?a ?b) (mul ?a ?c))",
    ));
    r.extend(bi(
        "sub-as-add-neg",
        "(sub ?a ?b)",
        "(add ?a (unary neg ?b))",
    ));
    r
}

/// Transposes: composition, and distribution over element-wise ops and
/// matrix products.
pub fn layout() -> Vec<Rule> {
    let mut r = vec![computed(
        "transpose-transpose",
        "(transpose ?p (transpose ?q ?x))",
        |eg, s| {
            let (p, q) = (sym_list(eg, s, "?p")?, sym_list(eg, s, "?q")?);
            // z[i] = y[p[i]] = x[q[p[i]]]
            let r: Vec<usize> = p
                .iter()
                .map(|&i| q.get(i).copied())
                .collect::<Option<_>>()?;
            Some(if r.iter().enumerate().all(|(i, &x)| i == x) {
                "?x".into()
            } else {
                format!("(transpose {} ?x)", list(&r))
            })
        },
    )];
    r.extend(bi(
        "transpose-unary",
        "(transpose ?p (unary ?f ?x))",
        "(unary ?f (transpose ?p ?x))",
    ));
    for op in ["add", "sub", "mul", "div"] {
        r.extend(bi(
            &format!("transpose-{op}"),
            &format!("(transpose ?p ({op} ?a ?b))"),
            &format!("({op} (transpose ?p ?a) (transpose ?p ?b))"),
        ));
    }
    r.extend(bi_if(
        "transpose-matmul",
        "(transpose ?p (matmul ?a ?b))",
        "(matmul (transpose ?p ?b) (transpose ?p ?a))",
        |eg, s| sym_list(eg, s, "?p").is_some_and(|p| swaps_last_two(&p)),
    ));
    r
}

fn swaps_last_two(p: &[usize]) -> bool {
    let n = p.len();
    n >= 2
        && p[..n - 2].iter().enumerate().all(|(i, &x)| i == x)
        && p[n - 2] == n - 1
        && p[n - 1] == n - 2
}

fn all_matrices(eg: &TEGraph, s: &Subst, vars: &[&str]) -> bool {
    vars.iter()
        .all(|v| shape(eg, s, v).is_some_and(|sh| sh.len() >= 2))
}

fn is_scalar(eg: &TEGraph, s: &Subst, v: &str) -> bool {
    shape(eg, s, v).is_some_and(|sh| sh.is_empty())
}

/// Matrix products: associativity, distribution over addition, scalars.
pub fn matmul() -> Vec<Rule> {
    let mut r = Vec::new();
    r.extend(bi_if(
        "matmul-assoc",
        "(matmul (matmul ?a ?b) ?c)",
        "(matmul ?a (matmul ?b ?c))",
        |eg, s| all_matrices(eg, s, &["?a", "?b", "?c"]),
    ));
    r.extend(bi_if(
        "matmul-distrib-right",
        "(matmul ?a (add ?b ?c))",
        "(add (matmul ?a ?b) (matmul ?a ?c))",
        |eg, s| same_shape(eg, s, "?b", "?c") && all_matrices(eg, s, &["?a", "?b"]),
    ));
    r.extend(bi_if(
        "matmul-distrib-left",
        "(matmul (add ?a ?b) ?c)",
        "(add (matmul ?a ?c) (matmul ?b ?c))",
        |eg, s| same_shape(eg, s, "?a", "?b") && all_matrices(eg, s, &["?a", "?c"]),
    ));
    r.extend(bi_if(
        "matmul-mul-scalar",
        "(mul (matmul ?a ?b) ?s)",
        "(matmul ?a (mul ?b ?s))",
        |eg, s| is_scalar(eg, s, "?s"),
    ));
    r.extend(bi_if(
        "matmul-div-scalar",
        "(div (matmul ?a ?b) ?s)",
        "(matmul (div ?a ?s) ?b)",
        |eg, s| is_scalar(eg, s, "?s"),
    ));
    r
}

fn scalar_const(eg: &mut TEGraph, value: f64, dtype: DType) -> usize {
    eg.analysis
        .tables
        .intern_const(ConstValue::Splat(value), TensorType::scalar(dtype))
}

/// Convolutions: bilinearity, and folding of batchnorm and per-channel
/// scales into the weights (work on weights only, done once when the weights
/// are constants). A relu after a convolution needs no rule: the back end
/// applies it in the convolution's epilogue, and the cost model prices it so.
pub fn conv() -> Vec<Rule> {
    let mut r = Vec::new();
    r.extend(bi_if(
        "conv-bilinear-weights",
        "(add (conv2d ?s ?p ?g ?x ?w1) (conv2d ?s ?p ?g ?x ?w2))",
        "(conv2d ?s ?p ?g ?x (add ?w1 ?w2))",
        |eg, s| same_shape(eg, s, "?w1", "?w2"),
    ));
    r.extend(bi_if(
        "conv-bilinear-input",
        "(add (conv2d ?s ?p ?g ?x1 ?w) (conv2d ?s ?p ?g ?x2 ?w))",
        "(conv2d ?s ?p ?g (add ?x1 ?x2) ?w)",
        |eg, s| same_shape(eg, s, "?x1", "?x2"),
    ));
    r.push(computed(
        "conv-batchnorm-fold",
        "(batchnorm ?eps (conv2d ?s ?p ?g ?x ?w) ?m ?v ?gm ?bt)",
        |eg, s| {
            let o = *shape(eg, s, "?w")?.first()?;
            let dtype = ty(eg, s, "?v")?.dtype;
            let eps: f64 = match eg[*s.get(var("?eps"))?].data {
                Data::Sym(sym) => sym.as_str().parse().ok()?,
                _ => return None,
            };
            let k = scalar_const(eg, eps, dtype);
            let scale = format!("(div ?gm (unary sqrt (add ?v (const {k}))))");
            Some(format!(
                "(add (conv2d ?s ?p ?g ?x (mul ?w (reshape {w} {scale}))) \
                      (reshape {b} (sub ?bt (mul ?m {scale}))))",
                w = list(&[o, 1, 1, 1]),
                b = list(&[o, 1, 1]),
            ))
        },
    ));
    r.push(computed(
        "conv-scale-fold",
        "(mul (conv2d ?s ?p ?g ?x ?w) ?c)",
        |eg, s| {
            let o = *shape(eg, s, "?w")?.first()?;
            match shape(eg, s, "?c")? {
                [] => Some("(conv2d ?s ?p ?g ?x (mul ?w ?c))".into()),
                [c, 1, 1] if *c == o => Some(format!(
                    "(conv2d ?s ?p ?g ?x (mul ?w (reshape {} ?c)))",
                    list(&[o, 1, 1, 1])
                )),
                _ => None,
            }
        },
    ));
    // A scalar, or a per-input-channel scale of a single image
    // (squeeze-excite's `x * sigmoid(..)` before its projection, either
    // operand first), scales the weights' input channels instead:
    // `O * C * kh * kw` multiplies in place of a pass over `C * H * W` (zero
    // padding stays zero either way). Several images would need a weight
    // tensor each, and a grouped convolution's input channels are not its
    // weights' second axis.
    for (name, lhs) in [
        ("conv-input-scale-fold", "(conv2d ?s ?p ?g (mul ?x ?c) ?w)"),
        (
            "conv-input-scale-fold-left",
            "(conv2d ?s ?p ?g (mul ?c ?x) ?w)",
        ),
    ] {
        r.push(computed(name, lhs, |eg, s| {
            let &[n, c, _, _] = shape(eg, s, "?x")? else {
                return None;
            };
            match shape(eg, s, "?c")? {
                [] => Some("(conv2d ?s ?p ?g ?x (mul ?w ?c))".into()),
                [1, k, 1, 1] | [k, 1, 1] if *k == c && n == 1 && num(eg, s, "?g")? == 1 => {
                    Some(format!(
                        "(conv2d ?s ?p ?g ?x (mul ?w (reshape {} ?c)))",
                        list(&[1, c, 1, 1])
                    ))
                }
                _ => None,
            }
        }));
    }
    r
}

/// Slices and concatenations: slices of concatenations and of slices,
/// adjacent slices, and concatenation commuting with element-wise ops.
pub fn split_concat() -> Vec<Rule> {
    let mut r = vec![
        computed(
            "slice-concat",
            "(slice ?ax ?s ?e (concat ?ax ?a ?b))",
            |eg, s| {
                let (ax, st, en) = (num(eg, s, "?ax")?, num(eg, s, "?s")?, num(eg, s, "?e")?);
                let na = *shape(eg, s, "?a")?.get(ax)?;
                let nb = *shape(eg, s, "?b")?.get(ax)?;
                if en <= na {
                    Some(if st == 0 && en == na {
                        "?a".into()
                    } else {
                        format!("(slice {ax} {st} {en} ?a)")
                    })
                } else if st >= na {
                    Some(if st == na && en == na + nb {
                        "?b".into()
                    } else {
                        format!("(slice {ax} {} {} ?b)", st - na, en - na)
                    })
                } else {
                    None
                }
            },
        ),
        computed(
            "slice-slice",
            "(slice ?ax ?s ?e (slice ?ax ?s2 ?e2 ?x))",
            |eg, s| {
                let (ax, st, en) = (num(eg, s, "?ax")?, num(eg, s, "?s")?, num(eg, s, "?e")?);
                let s2 = num(eg, s, "?s2")?;
                Some(format!("(slice {ax} {} {} ?x)", s2 + st, s2 + en))
            },
        ),
        computed("slice-whole", "(slice ?ax ?s ?e ?x)", |eg, s| {
            let (ax, st, en) = (num(eg, s, "?ax")?, num(eg, s, "?s")?, num(eg, s, "?e")?);
            (st == 0 && shape(eg, s, "?x")?.get(ax) == Some(&en)).then(|| "?x".into())
        }),
        rw(
            "concat-adjacent-slices",
            "(concat ?ax (slice ?ax ?a ?b ?x) (slice ?ax ?b ?c ?x))",
            "(slice ?ax ?a ?c ?x)",
        ),
    ];
    r.extend(bi(
        "concat-unary",
        "(concat ?ax (unary ?f ?a) (unary ?f ?b))",
        "(unary ?f (concat ?ax ?a ?b))",
    ));
    for op in ["add", "mul"] {
        r.extend(bi_if(
            &format!("concat-{op}"),
            &format!("(concat ?ax ({op} ?a ?b) ({op} ?c ?d))"),
            &format!("({op} (concat ?ax ?a ?c) (concat ?ax ?b ?d))"),
            |eg, s| same_shape(eg, s, "?a", "?b") && same_shape(eg, s, "?c", "?d"),
        ));
    }
    r.extend(bi(
        "slice-unary",
        "(slice ?ax ?s ?e (unary ?f ?x))",
        "(unary ?f (slice ?ax ?s ?e ?x))",
    ));
    r
}

fn distinct(eg: &TEGraph, s: &Subst) -> bool {
    match (s.get(var("?a")), s.get(var("?b"))) {
        (Some(a), Some(b)) => eg.find(*a) < eg.find(*b),
        _ => false,
    }
}

/// Multi-pattern merges: products (or convolutions) that share an operand
/// become one product on concatenated operands followed by slices. Applied
/// only in the first iterations, as Tensat does, so the e-graph stays small.
pub fn merge() -> Vec<Rule> {
    vec![
        multi(
            "merge-matmul-shared-lhs",
            "?a = (matmul ?x ?w1), ?b = (matmul ?x ?w2)",
            |eg, s| {
                if !distinct(eg, s) {
                    return None;
                }
                let (w1, w2) = (shape(eg, s, "?w1")?, shape(eg, s, "?w2")?);
                let wax = w1.len().checked_sub(1)?;
                let (n1, n2) = (*w1.get(wax)?, *w2.get(wax)?);
                let rax = shape(eg, s, "?a")?.len().checked_sub(1)?;
                if w1.len() < 2 {
                    return None;
                }
                let merged = format!("(matmul ?x (concat {wax} ?w1 ?w2))");
                Some(vec![
                    ("?a", format!("(slice {rax} 0 {n1} {merged})")),
                    ("?b", format!("(slice {rax} {n1} {} {merged})", n1 + n2)),
                ])
            },
        ),
        multi(
            "merge-matmul-shared-rhs",
            "?a = (matmul ?x1 ?w), ?b = (matmul ?x2 ?w)",
            |eg, s| {
                if !distinct(eg, s) {
                    return None;
                }
                let (x1, x2) = (shape(eg, s, "?x1")?, shape(eg, s, "?x2")?);
                let xax = x1.len().checked_sub(2)?;
                let (m1, m2) = (*x1.get(xax)?, *x2.get(xax)?);
                let rax = shape(eg, s, "?a")?.len().checked_sub(2)?;
                let merged = format!("(matmul (concat {xax} ?x1 ?x2) ?w)");
                Some(vec![
                    ("?a", format!("(slice {rax} 0 {m1} {merged})")),
                    ("?b", format!("(slice {rax} {m1} {} {merged})", m1 + m2)),
                ])
            },
        ),
        multi(
            "merge-conv-shared-input",
            "?a = (conv2d ?s ?p 1 ?x ?w1), ?b = (conv2d ?s ?p 1 ?x ?w2)",
            |eg, s| {
                if !distinct(eg, s) {
                    return None;
                }
                let (o1, o2) = (
                    *shape(eg, s, "?w1")?.first()?,
                    *shape(eg, s, "?w2")?.first()?,
                );
                let merged = "(conv2d ?s ?p 1 ?x (concat 0 ?w1 ?w2))";
                Some(vec![
                    ("?a", format!("(slice 1 0 {o1} {merged})")),
                    ("?b", format!("(slice 1 {o1} {} {merged})", o1 + o2)),
                ])
            },
        ),
    ]
}

/// Every table, by name: `(name, rules, multi-pattern)`.
pub fn tables() -> Vec<(&'static str, Vec<Rule>, bool)> {
    vec![
        ("algebra", algebra(), false),
        ("layout", layout(), false),
        ("matmul", matmul(), false),
        ("conv", conv(), false),
        ("split-concat", split_concat(), false),
        ("merge", merge(), true),
    ]
}

/// The names of every table.
pub const TABLES: [&str; 6] = [
    "algebra",
    "layout",
    "matmul",
    "conv",
    "split-concat",
    "merge",
];
