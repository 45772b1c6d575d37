//! The term language of equality saturation: one flat egg language whose op
//! names match the graph dialect's, with attributes as leaf children (so a
//! pattern can bind them: `(transpose ?p (transpose ?q ?x))`), and an
//! [`Analysis`] holding each e-class's type and whether it depends only on
//! constants.

use std::collections::{BTreeSet, HashMap};

use dlc_core::TensorType;
use egg::{Analysis, DidMerge, EGraph, Id, Language, Symbol};
use petgraph::stable_graph::NodeIndex;

use crate::infer::infer;
use crate::module::{Function, Value};
use crate::ops::{BinaryOp, ConstValue, Op, UnaryOp};

// The variants are the op names; the enum's documentation says what each
// holds.
#[allow(missing_docs)]
mod term {
    use egg::{Id, Symbol, define_language};

    define_language! {
        /// A graph-dialect op as an e-node. Attributes come first, as leaves:
        /// `(transpose [1,0] ?x)`, `(slice 1 0 64 ?x)`, `(concat 1 ?a ?b)`,
        /// `(conv2d [1,1] [1,1] 1 ?x ?w)`, `(batchnorm 1e-5 ?x ?m ?v ?g ?b)`.
        /// Ops that no rule looks inside (reductions, softmax, layernorm,
        /// pooling, comparisons, casts, user-defined `compute` operators) are
        /// `(opaque k ?args..)` with `k` indexing [`Tables::ops`]: rules still
        /// move work around them and share their operands.
        pub enum TLang {
            "param" = Param([Id; 1]),
            "const" = Const([Id; 1]),
            "unary" = Unary([Id; 2]),
            "add" = Add([Id; 2]),
            "sub" = Sub([Id; 2]),
            "mul" = Mul([Id; 2]),
            "div" = Div([Id; 2]),
            "binary" = Binary([Id; 3]),
            "matmul" = MatMul([Id; 2]),
            "transpose" = Transpose([Id; 2]),
            "reshape" = Reshape([Id; 2]),
            "broadcast" = Broadcast([Id; 2]),
            "concat" = Concat(Box<[Id]>),
            "slice" = Slice([Id; 4]),
            "conv2d" = Conv2d([Id; 5]),
            "batchnorm" = BatchNorm([Id; 6]),
            "opaque" = Opaque(Box<[Id]>),
            Num(i64),
            Sym(Symbol),
        }
    }
}

pub use term::TLang;

/// What the term language refers to by index: parameter types, constant
/// values and the ops of opaque nodes.
#[derive(Debug, Clone, Default)]
pub struct Tables {
    /// `(param i)` has type `params[i]`.
    pub params: Vec<TensorType>,
    /// Whether `(param i)` is a declared weight.
    pub weight_params: Vec<bool>,
    /// `(const k)` is `consts[k]`.
    pub consts: Vec<(ConstValue, TensorType)>,
    /// `(opaque k ..)` applies `ops[k]`.
    pub ops: Vec<Op>,
}

impl Tables {
    /// The index of a constant, added if new.
    pub fn intern_const(&mut self, value: ConstValue, ty: TensorType) -> usize {
        if let Some(k) = self
            .consts
            .iter()
            .position(|(v, t)| *t == ty && const_eq(v, &value))
        {
            return k;
        }
        self.consts.push((value, ty));
        self.consts.len() - 1
    }

    fn intern_op(&mut self, op: &Op) -> usize {
        if let Some(k) = self.ops.iter().position(|o| o == op) {
            return k;
        }
        self.ops.push(op.clone());
        self.ops.len() - 1
    }
}

fn const_eq(a: &ConstValue, b: &ConstValue) -> bool {
    match (a, b) {
        (ConstValue::Splat(x), ConstValue::Splat(y)) => x.to_bits() == y.to_bits(),
        (ConstValue::Dense(x), ConstValue::Dense(y)) => {
            std::sync::Arc::ptr_eq(x, y)
                || (x.len() == y.len()
                    && x.iter()
                        .zip(y.iter())
                        .all(|(p, q)| p.to_bits() == q.to_bits()))
        }
        _ => false,
    }
}

/// What an e-class is known to be.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// An integer attribute.
    Num(i64),
    /// Any other attribute (a list, a float, a name).
    Sym(Symbol),
    /// A tensor value.
    Tensor(Info),
    /// A term that does not type-check; typed rule application never adds
    /// one, and extraction never picks one.
    Invalid,
}

/// Facts about a tensor-valued e-class.
#[derive(Debug, Clone, PartialEq)]
pub struct Info {
    /// Its type.
    pub ty: TensorType,
    /// Whether it depends only on constants (so is computed once, at
    /// compile time).
    pub weights: bool,
    /// Whether it is a parameter or a constant.
    pub leaf: bool,
    /// Whether it is computed from declared weights (and constants) alone,
    /// with at least one weight: once per binding of the weights, by the
    /// preparer, so a call pays nothing for it.
    pub bound: bool,
}

impl Data {
    /// The tensor facts, if a tensor.
    pub fn info(&self) -> Option<&Info> {
        match self {
            Data::Tensor(i) => Some(i),
            _ => None,
        }
    }

    /// The tensor type, if a tensor.
    pub fn ty(&self) -> Option<&TensorType> {
        self.info().map(|i| &i.ty)
    }
}

/// The analysis: tables, plus a count of merges of differently typed
/// classes (always zero unless a rule is wrong; the soundness tests check).
#[derive(Debug, Clone, Default)]
pub struct TensorAnalysis {
    /// Parameter types, constants, opaque ops.
    pub tables: Tables,
    /// Merges of classes whose types differed.
    pub conflicts: usize,
    /// The classes of settled graph nodes (`Node::settled`), as encoded:
    /// single-pattern rules do not rewrite them again.
    pub settled: std::collections::HashSet<Id>,
}

/// The e-graph.
pub type TEGraph = EGraph<TLang, TensorAnalysis>;

impl Analysis<TLang> for TensorAnalysis {
    type Data = Data;

    fn make(egraph: &mut TEGraph, enode: &TLang, _id: Id) -> Data {
        compute_data(&egraph.analysis.tables, enode, &|c| egraph[c].data.clone())
    }

    fn merge(&mut self, to: &mut Data, from: Data) -> DidMerge {
        match (&mut *to, from) {
            (Data::Tensor(a), Data::Tensor(b)) => {
                if a.ty != b.ty {
                    self.conflicts += 1;
                    return DidMerge(false, true);
                }
                // Equal values: if either form needs only constants, so does
                // the class.
                let weights = a.weights || b.weights;
                let leaf = a.leaf || b.leaf;
                let bound = a.bound || b.bound;
                let changed = weights != a.weights || leaf != a.leaf || bound != a.bound;
                a.weights = weights;
                a.leaf = leaf;
                a.bound = bound;
                DidMerge(
                    changed,
                    weights != b.weights || leaf != b.leaf || bound != b.bound,
                )
            }
            (Data::Invalid, b @ Data::Tensor(_)) => {
                *to = b;
                DidMerge(true, false)
            }
            (a, b) => DidMerge(false, *a != b),
        }
    }
}

/// An e-node decoded into a graph op (or a constant-table entry) and the
/// e-classes of its tensor operands.
pub enum Head {
    /// A graph op.
    Op(Op),
    /// `(const k)`.
    Const(usize),
}

fn num(d: &Data) -> Option<i64> {
    match d {
        Data::Num(n) => Some(*n),
        _ => None,
    }
}

fn usize_of(d: &Data) -> Option<usize> {
    num(d).and_then(|n| usize::try_from(n).ok())
}

fn sym(d: &Data) -> Option<&str> {
    match d {
        Data::Sym(s) => Some(s.as_str()),
        _ => None,
    }
}

/// Parses a list attribute `[1,0,2]`.
pub fn parse_list(s: &str) -> Option<Vec<usize>> {
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    if inner.trim().is_empty() {
        return Some(vec![]);
    }
    inner.split(',').map(|x| x.trim().parse().ok()).collect()
}

/// The text of a list attribute (`[1,0,2]`).
pub fn list(v: &[usize]) -> String {
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(","))
}

/// The text of a float attribute, exact when parsed back.
pub fn float(x: f64) -> String {
    format!("{x:?}")
}

/// Decodes `node` given its children's data.
pub fn decode(tables: &Tables, node: &TLang, get: &dyn Fn(Id) -> Data) -> Option<(Head, Vec<Id>)> {
    let c = |i: usize| get(node.children()[i]);
    let pair = |d: Data| -> Option<[usize; 2]> {
        let v = parse_list(sym(&d)?)?;
        <[usize; 2]>::try_from(v.as_slice()).ok()
    };
    let op = match node {
        TLang::Param([_]) => {
            let index = u32::try_from(usize_of(&c(0))?).ok()?;
            return (usize::try_from(index).ok()? < tables.params.len())
                .then_some((Head::Op(Op::Param { index }), vec![]));
        }
        TLang::Const([_]) => {
            let k = usize_of(&c(0))?;
            return (k < tables.consts.len()).then_some((Head::Const(k), vec![]));
        }
        TLang::Unary([_, x]) => {
            return Some((
                Head::Op(Op::Unary(UnaryOp::from_name(sym(&c(0))?)?)),
                vec![*x],
            ));
        }
        TLang::Add(_) => Op::Binary(BinaryOp::Add),
        TLang::Sub(_) => Op::Binary(BinaryOp::Sub),
        TLang::Mul(_) => Op::Binary(BinaryOp::Mul),
        TLang::Div(_) => Op::Binary(BinaryOp::Div),
        TLang::Binary([_, a, b]) => {
            let d = c(0);
            let name = sym(&d)?;
            let b_op = BinaryOp::ALL.into_iter().find(|o| o.name() == name)?;
            return Some((Head::Op(Op::Binary(b_op)), vec![*a, *b]));
        }
        TLang::MatMul(_) => Op::MatMul,
        TLang::Transpose([_, x]) => {
            let perm = parse_list(sym(&c(0))?)?;
            return Some((Head::Op(Op::Transpose { perm }), vec![*x]));
        }
        TLang::Reshape([_, x]) => {
            let shape = parse_list(sym(&c(0))?)?;
            return Some((Head::Op(Op::Reshape { shape }), vec![*x]));
        }
        TLang::Broadcast([_, x]) => {
            let shape = parse_list(sym(&c(0))?)?;
            return Some((Head::Op(Op::Broadcast { shape }), vec![*x]));
        }
        TLang::Concat(ch) => {
            let axis = usize_of(&c(0))?;
            return Some((Head::Op(Op::Concat { axis }), ch[1..].to_vec()));
        }
        TLang::Slice([_, _, _, x]) => {
            let op = Op::Slice {
                axis: usize_of(&c(0))?,
                start: usize_of(&c(1))?,
                end: usize_of(&c(2))?,
            };
            return Some((Head::Op(op), vec![*x]));
        }
        TLang::Conv2d([_, _, _, x, w]) => {
            let op = Op::Conv2d {
                stride: pair(c(0))?,
                padding: pair(c(1))?,
                groups: usize_of(&c(2))?,
                dilation: [1, 1],
            };
            return Some((Head::Op(op), vec![*x, *w]));
        }
        TLang::BatchNorm([_, rest @ ..]) => {
            let eps: f64 = sym(&c(0))?.parse().ok()?;
            return Some((Head::Op(Op::BatchNorm { eps }), rest.to_vec()));
        }
        TLang::Opaque(ch) => {
            let k = usize_of(&c(0))?;
            return Some((Head::Op(tables.ops.get(k)?.clone()), ch[1..].to_vec()));
        }
        TLang::Num(_) | TLang::Sym(_) => return None,
    };
    Some((Head::Op(op), node.children().to_vec()))
}

/// `node` decoded, with its operand classes' facts and its own: its type by
/// the graph dialect's own inference. `None` if it does not decode or
/// type-check (or is an attribute leaf).
pub fn typed(
    tables: &Tables,
    node: &TLang,
    get: &dyn Fn(Id) -> Data,
) -> Option<(Head, Vec<Info>, Info)> {
    let (head, operands) = decode(tables, node, get)?;
    let infos: Vec<Info> = operands
        .iter()
        .map(|&o| get(o).info().cloned())
        .collect::<Option<_>>()?;
    let own = match &head {
        Head::Const(k) => Info {
            ty: tables.consts[*k].1.clone(),
            weights: true,
            leaf: true,
            bound: false,
        },
        Head::Op(Op::Param { index }) => Info {
            ty: tables.params[*index as usize].clone(),
            weights: false,
            leaf: true,
            bound: tables
                .weight_params
                .get(*index as usize)
                .copied()
                .unwrap_or(false),
        },
        Head::Op(op) => {
            let types: Vec<&TensorType> = infos.iter().map(|i| &i.ty).collect();
            if let Op::Compute(body) = op {
                crate::verify::check_compute(body, &types).ok()?;
            }
            let mut tys = infer(op, &types).ok()?;
            if tys.len() != 1 {
                return None;
            }
            Info {
                ty: tys.remove(0),
                weights: infos.iter().all(|i| i.weights),
                leaf: false,
                bound: infos.iter().any(|i| i.bound) && infos.iter().all(|i| i.bound || i.weights),
            }
        }
    };
    Some((head, infos, own))
}

/// The data of `node` given its children's data: see [`typed`].
pub fn compute_data(tables: &Tables, node: &TLang, get: &dyn Fn(Id) -> Data) -> Data {
    match node {
        TLang::Num(n) => Data::Num(*n),
        TLang::Sym(s) => Data::Sym(*s),
        _ => typed(tables, node, get).map_or(Data::Invalid, |(_, _, own)| Data::Tensor(own)),
    }
}

/// A function as an e-graph: the root class of each result, and for each
/// class the graph node it came from (to keep the original order when
/// nothing changes).
pub struct Encoded {
    /// The e-graph.
    pub egraph: TEGraph,
    /// The class of each function result, in order.
    pub roots: Vec<Id>,
    /// The original node of each class that has one.
    pub origin: HashMap<Id, NodeIndex>,
}

/// Why a function is left alone by saturation.
#[derive(Debug, Clone, PartialEq)]
pub enum Unsupported {
    /// It calls another function (run `graph.inline` first).
    Call,
    /// It has an op with several results.
    MultiResult,
}

/// Builds the e-graph of `f`.
pub fn encode(f: &Function) -> Result<Encoded, Unsupported> {
    let mut egraph = TEGraph::new(TensorAnalysis {
        tables: Tables {
            params: f.param_types(),
            weight_params: (0..f.params.len()).map(|i| f.is_weight(i)).collect(),
            ..Tables::default()
        },
        conflicts: 0,
        settled: Default::default(),
    });
    let mut class: HashMap<NodeIndex, Id> = HashMap::new();
    let mut origin = HashMap::new();
    for n in f.topo_order() {
        let node = &f.body[n];
        if matches!(node.op, Op::Call { .. }) {
            return Err(Unsupported::Call);
        }
        if node.results.len() != 1 {
            return Err(Unsupported::MultiResult);
        }
        let operands: Vec<Id> = f.operands(n).iter().map(|v| class[&v.node]).collect();
        let term = term(&mut egraph, node, &operands);
        let id = egraph.add(term);
        class.insert(n, id);
        origin.entry(id).or_insert(n);
    }
    egraph.rebuild();
    // A class is settled only if every graph node in it is (a settled and
    // an unsettled node of one form share a class).
    let mut unsettled = std::collections::HashSet::new();
    for (&n, &id) in &class {
        let c = egraph.find(id);
        if f.body[n].settled {
            egraph.analysis.settled.insert(c);
        } else {
            unsettled.insert(c);
        }
    }
    egraph.analysis.settled.retain(|c| !unsettled.contains(c));
    let roots = f
        .results
        .iter()
        .map(|v: &Value| egraph.find(class[&v.node]))
        .collect();
    let origin = origin
        .into_iter()
        .map(|(id, n)| (egraph.find(id), n))
        .collect();
    Ok(Encoded {
        egraph,
        roots,
        origin,
    })
}

/// The e-node of a graph node whose operands are in `operands`. Constants
/// and ops no rule looks inside (reductions, softmax, layernorm, pooling,
/// comparisons, selects, casts, user operators) go into the tables first,
/// so the analysis finds them when the node is added.
fn term(eg: &mut TEGraph, node: &crate::module::Node, operands: &[Id]) -> TLang {
    let op = &node.op;
    if let Op::Constant(v) = op {
        let k = eg
            .analysis
            .tables
            .intern_const(v.clone(), node.results[0].clone());
        let leaf = eg.add(TLang::Num(k as i64));
        return TLang::Const([leaf]);
    }
    let mut leaf = |n: TLang| eg.add(n);
    let num = |x: usize| TLang::Num(x as i64);
    let s = |x: String| TLang::Sym(Symbol::from(x));
    let unary = |a: Id, x: &[Id]| [a, x[0]];
    match op {
        Op::Param { index } => TLang::Param([leaf(num(*index as usize))]),
        Op::Unary(u) => TLang::Unary(unary(leaf(s(u.name().into())), operands)),
        Op::Binary(b) => {
            let (x, y) = (operands[0], operands[1]);
            match b {
                BinaryOp::Add => TLang::Add([x, y]),
                BinaryOp::Sub => TLang::Sub([x, y]),
                BinaryOp::Mul => TLang::Mul([x, y]),
                BinaryOp::Div => TLang::Div([x, y]),
                _ => TLang::Binary([leaf(s(b.name().into())), x, y]),
            }
        }
        Op::MatMul => TLang::MatMul([operands[0], operands[1]]),
        Op::Transpose { perm } => TLang::Transpose(unary(leaf(s(list(perm))), operands)),
        Op::Reshape { shape } => TLang::Reshape(unary(leaf(s(list(shape))), operands)),
        Op::Broadcast { shape } => TLang::Broadcast(unary(leaf(s(list(shape))), operands)),
        Op::Concat { axis } => {
            let mut ch = vec![leaf(num(*axis))];
            ch.extend_from_slice(operands);
            TLang::Concat(ch.into_boxed_slice())
        }
        Op::Slice { axis, start, end } => TLang::Slice([
            leaf(num(*axis)),
            leaf(num(*start)),
            leaf(num(*end)),
            operands[0],
        ]),
        // A dilated convolution is opaque: the rules are about dense windows.
        Op::Conv2d {
            stride,
            padding,
            groups,
            dilation: [1, 1],
        } => TLang::Conv2d([
            leaf(s(list(stride))),
            leaf(s(list(padding))),
            leaf(num(*groups)),
            operands[0],
            operands[1],
        ]),
        Op::BatchNorm { eps } => TLang::BatchNorm([
            leaf(s(float(*eps))),
            operands[0],
            operands[1],
            operands[2],
            operands[3],
            operands[4],
        ]),
        // Every other op is opaque to the rules.
        op => {
            let k = eg.analysis.tables.intern_op(op);
            let mut ch = vec![eg.add(num(k))];
            ch.extend_from_slice(operands);
            TLang::Opaque(ch.into_boxed_slice())
        }
    }
}

/// The classes reachable from `roots` through any node.
pub fn reachable(eg: &TEGraph, roots: &[Id]) -> BTreeSet<Id> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<Id> = roots.iter().map(|&r| eg.find(r)).collect();
    while let Some(c) = stack.pop() {
        if seen.insert(c) {
            for n in &eg[c].nodes {
                stack.extend(n.children().iter().map(|&ch| eg.find(ch)));
            }
        }
    }
    seen
}
