//! The pass infrastructure: a [`Pass`] transforms one IR in place, a
//! [`PassRegistry`] builds passes by name from a textual [`Pipeline`]
//! (`a,b{key=value},c`), and a [`PassManager`] runs them, verifying the IR
//! before the first pass and after each one, timing each and collecting its
//! statistics.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use crate::VerifyError;

/// An IR that can check its own invariants.
pub trait Verify {
    /// Every problem found, not just the first.
    fn verify(&self) -> Result<(), Vec<VerifyError>>;
}

/// A transformation of one IR, in place.
pub trait Pass<IR> {
    /// The registered name (`graph.canonicalize`).
    fn name(&self) -> &'static str;
    /// Runs the pass; returns named counters for `--stats`.
    fn run(&mut self, ir: &mut IR) -> Result<Vec<(&'static str, u64)>, PassError>;
}

/// Why a pipeline could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// A pipeline names a pass the registry does not have.
    #[error("unknown pass `{name}`; known passes: {known}")]
    UnknownPass {
        /// The name given.
        name: String,
        /// The registered names, comma separated.
        known: String,
    },
    /// The pipeline text is malformed.
    #[error("bad pipeline at column {column}: {message}")]
    Syntax {
        /// 1-based column in the pipeline text.
        column: usize,
        /// What was expected.
        message: String,
    },
    /// A pass was given an option it does not take, or a bad value.
    #[error("pass `{pass}`: {message}")]
    BadOption {
        /// The pass.
        pass: String,
        /// What is wrong.
        message: String,
    },
    /// A pass could not do its work.
    #[error("pass `{pass}` failed: {message}")]
    Failed {
        /// The pass.
        pass: String,
        /// Why.
        message: String,
    },
    /// The IR broke an invariant (before the pipeline, or after `pass`).
    #[error("{}", verify_message(.pass, .errors))]
    Verify {
        /// The pass after which verification failed; `None` for the input.
        pass: Option<String>,
        /// Every problem the verifier found.
        errors: Vec<VerifyError>,
    },
}

fn verify_message(pass: &Option<String>, errors: &[VerifyError]) -> String {
    let mut s = match pass {
        Some(p) => format!("IR is invalid after pass `{p}`:"),
        None => "input IR is invalid:".to_string(),
    };
    for e in errors {
        s.push_str("\n  ");
        s.push_str(&e.to_string());
    }
    s
}

/// The `key=value` options of one pipeline entry, with typed accessors that
/// reject unknown keys and malformed values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassOptions {
    pass: String,
    values: BTreeMap<String, String>,
}

impl PassOptions {
    /// Options for `pass` from parsed pairs.
    pub fn new(pass: &str, values: BTreeMap<String, String>) -> Self {
        PassOptions {
            pass: pass.to_string(),
            values,
        }
    }

    /// Fails if any option is not in `known`.
    pub fn expect_only(&self, known: &[&str]) -> Result<(), PassError> {
        for key in self.values.keys() {
            if !known.contains(&key.as_str()) {
                let takes = if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                };
                return Err(PassError::BadOption {
                    pass: self.pass.clone(),
                    message: format!("unknown option `{key}`; options it takes: {takes}"),
                });
            }
        }
        Ok(())
    }

    /// An option parsed with `FromStr`, or `default` when absent.
    pub fn get<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T, PassError> {
        match self.values.get(key) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| PassError::BadOption {
                pass: self.pass.clone(),
                message: format!("option `{key}` has a malformed value `{v}`"),
            }),
        }
    }
}

/// One entry of a pipeline: a pass name and its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineEntry {
    /// Pass name.
    pub name: String,
    /// Options given in braces.
    pub options: PassOptions,
}

/// A parsed pipeline: `a,b{key=value,k2=v2},c`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pipeline(pub Vec<PipelineEntry>);

impl Pipeline {
    /// Parses the textual pipeline form. Whitespace around names is ignored;
    /// an empty text is the empty pipeline.
    pub fn parse(text: &str) -> Result<Pipeline, PassError> {
        let chars: Vec<char> = text.chars().collect();
        let mut pos = 0;
        let mut entries = Vec::new();
        let err = |pos: usize, message: &str| PassError::Syntax {
            column: pos + 1,
            message: message.to_string(),
        };
        let is_name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        let skip_ws = |pos: &mut usize| {
            while *pos < chars.len() && chars[*pos].is_whitespace() {
                *pos += 1;
            }
        };
        skip_ws(&mut pos);
        if pos == chars.len() {
            return Ok(Pipeline(entries));
        }
        loop {
            skip_ws(&mut pos);
            let start = pos;
            while pos < chars.len() && is_name(chars[pos]) {
                pos += 1;
            }
            if start == pos {
                return Err(err(pos, "expected a pass name"));
            }
            let name: String = chars[start..pos].iter().collect();
            skip_ws(&mut pos);
            let mut values = BTreeMap::new();
            if pos < chars.len() && chars[pos] == '{' {
                pos += 1;
                loop {
                    skip_ws(&mut pos);
                    let kstart = pos;
                    while pos < chars.len() && is_name(chars[pos]) {
                        pos += 1;
                    }
                    if kstart == pos {
                        return Err(err(pos, "expected an option name"));
                    }
                    let key: String = chars[kstart..pos].iter().collect();
                    skip_ws(&mut pos);
                    if pos >= chars.len() || chars[pos] != '=' {
                        return Err(err(pos, "expected `=` after the option name"));
                    }
                    pos += 1;
                    skip_ws(&mut pos);
                    let vstart = pos;
                    while pos < chars.len() && !matches!(chars[pos], ',' | '}') {
                        pos += 1;
                    }
                    let value: String = chars[vstart..pos].iter().collect();
                    let value = value.trim().to_string();
                    if value.is_empty() {
                        return Err(err(pos, "expected an option value"));
                    }
                    if values.insert(key.clone(), value).is_some() {
                        return Err(err(kstart, &format!("option `{key}` given twice")));
                    }
                    if pos >= chars.len() {
                        return Err(err(pos, "expected `}`"));
                    }
                    pos += 1;
                    if chars[pos - 1] == '}' {
                        break;
                    }
                }
                skip_ws(&mut pos);
            }
            let options = PassOptions::new(&name, values);
            entries.push(PipelineEntry { name, options });
            if pos == chars.len() {
                return Ok(Pipeline(entries));
            }
            if chars[pos] != ',' {
                return Err(err(pos, "expected `,` between passes"));
            }
            pos += 1;
        }
    }
}

impl fmt::Display for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&e.name)?;
            if !e.options.values.is_empty() {
                let opts: Vec<String> = e
                    .options
                    .values
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                write!(f, "{{{}}}", opts.join(","))?;
            }
        }
        Ok(())
    }
}

/// Adapts a pass over one IR to a larger IR (an enum over levels).
pub type PassAdapter<IR, Outer> = fn(Box<dyn Pass<IR>>) -> Box<dyn Pass<Outer>>;

type PassCtor<IR> = Box<dyn Fn(&PassOptions) -> Result<Box<dyn Pass<IR>>, PassError>>;

/// Named passes over one IR, built from pipeline text.
pub struct PassRegistry<IR> {
    passes: BTreeMap<&'static str, (&'static str, PassCtor<IR>)>,
}

impl<IR> Default for PassRegistry<IR> {
    fn default() -> Self {
        PassRegistry {
            passes: BTreeMap::new(),
        }
    }
}

impl<IR> PassRegistry<IR> {
    /// Registers `name` with a one-line description and a constructor that
    /// validates the pass's options.
    pub fn register(
        &mut self,
        name: &'static str,
        description: &'static str,
        ctor: impl Fn(&PassOptions) -> Result<Box<dyn Pass<IR>>, PassError> + 'static,
    ) {
        self.passes.insert(name, (description, Box::new(ctor)));
    }

    /// The same passes over a larger IR (an enum over levels): `wrap`
    /// adapts each built pass.
    pub fn lift<Outer>(self, wrap: PassAdapter<IR, Outer>) -> PassRegistry<Outer>
    where
        IR: 'static,
        Outer: 'static,
    {
        let mut out = PassRegistry::default();
        for (name, (description, ctor)) in self.passes {
            out.passes.insert(
                name,
                (
                    description,
                    Box::new(move |o: &PassOptions| ctor(o).map(wrap)) as PassCtor<Outer>,
                ),
            );
        }
        out
    }

    /// Adds every pass of `other`.
    pub fn extend(&mut self, other: PassRegistry<IR>) {
        self.passes.extend(other.passes);
    }

    /// `(name, description)` of every registered pass, sorted by name.
    pub fn describe(&self) -> Vec<(&'static str, &'static str)> {
        self.passes.iter().map(|(n, (d, _))| (*n, *d)).collect()
    }

    /// Builds the passes of `pipeline`, in order.
    pub fn build(&self, pipeline: &Pipeline) -> Result<Vec<Box<dyn Pass<IR>>>, PassError> {
        pipeline
            .0
            .iter()
            .map(|entry| match self.passes.get(entry.name.as_str()) {
                Some((_, ctor)) => ctor(&entry.options),
                None => Err(PassError::UnknownPass {
                    name: entry.name.clone(),
                    known: self.passes.keys().copied().collect::<Vec<_>>().join(", "),
                }),
            })
            .collect()
    }
}

/// What one pass did: its name, how long it took, and its counters.
#[derive(Debug, Clone)]
pub struct PassReport {
    /// Pass name.
    pub name: &'static str,
    /// Wall time of the pass alone (verification excluded).
    pub elapsed: Duration,
    /// Named counters the pass reported.
    pub stats: Vec<(&'static str, u64)>,
}

type AfterPassHook<'a, IR> = Box<dyn FnMut(&'static str, &IR) + 'a>;

/// Runs a list of passes over an IR.
pub struct PassManager<'a, IR> {
    passes: Vec<Box<dyn Pass<IR>>>,
    after_pass: Option<AfterPassHook<'a, IR>>,
}

impl<'a, IR: Verify> PassManager<'a, IR> {
    /// A manager for `passes`, run in order.
    pub fn new(passes: Vec<Box<dyn Pass<IR>>>) -> Self {
        PassManager {
            passes,
            after_pass: None,
        }
    }

    /// Calls `hook` with each pass's name and the IR after it
    /// (`--print-after-all`).
    pub fn after_each_pass(mut self, hook: impl FnMut(&'static str, &IR) + 'a) -> Self {
        self.after_pass = Some(Box::new(hook));
        self
    }

    /// Verifies `ir`, then runs every pass and verifies after each.
    pub fn run(&mut self, ir: &mut IR) -> Result<Vec<PassReport>, PassError> {
        ir.verify()
            .map_err(|errors| PassError::Verify { pass: None, errors })?;
        let mut reports = Vec::with_capacity(self.passes.len());
        for pass in &mut self.passes {
            let start = Instant::now();
            let stats = pass.run(ir)?;
            let elapsed = start.elapsed();
            let name = pass.name();
            ir.verify().map_err(|errors| PassError::Verify {
                pass: Some(name.to_string()),
                errors,
            })?;
            if let Some(hook) = &mut self.after_pass {
                hook(name, ir);
            }
            reports.push(PassReport {
                name,
                elapsed,
                stats,
            });
        }
        Ok(reports)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipeline_parses_names_and_options() {
        let p = Pipeline::parse(" a.b , c{k=1, j = x y } ,d").unwrap();
        assert_eq!(p.0.len(), 3);
        assert_eq!(p.0[1].name, "c");
        assert_eq!(p.0[1].options.get::<u32>("k", 0).unwrap(), 1);
        assert_eq!(
            p.0[1].options.get::<String>("j", String::new()).unwrap(),
            "x y"
        );
        assert_eq!(p.to_string(), "a.b,c{j=x y,k=1},d");
        assert_eq!(Pipeline::parse("").unwrap().0.len(), 0);
    }

    #[test]
    fn pipeline_syntax_errors_have_columns() {
        for (text, column) in [
            ("a,,b", 3),
            ("a{k}", 4),
            ("a{k=1", 6),
            ("a b", 3),
            ("a{k=1,k=2}", 7),
        ] {
            match Pipeline::parse(text) {
                Err(PassError::Syntax { column: c, .. }) => assert_eq!(c, column, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    struct Counter(u32);
    impl Verify for Counter {
        fn verify(&self) -> Result<(), Vec<VerifyError>> {
            if self.0 > 2 {
                Err(vec![VerifyError {
                    location: "c".into(),
                    message: "too big".into(),
                }])
            } else {
                Ok(())
            }
        }
    }
    struct Incr;
    impl Pass<Counter> for Incr {
        fn name(&self) -> &'static str {
            "incr"
        }
        fn run(&mut self, ir: &mut Counter) -> Result<Vec<(&'static str, u64)>, PassError> {
            ir.0 += 1;
            Ok(vec![("incremented", 1)])
        }
    }

    #[test]
    fn manager_verifies_after_each_pass() {
        let mut reg = PassRegistry::<Counter>::default();
        reg.register("incr", "adds one", |o| {
            o.expect_only(&[])?;
            Ok(Box::new(Incr))
        });
        let passes = reg.build(&Pipeline::parse("incr,incr").unwrap()).unwrap();
        let mut seen = Vec::new();
        let mut c = Counter(0);
        let reports = PassManager::new(passes)
            .after_each_pass(|n, ir| seen.push((n, ir.0)))
            .run(&mut c);
        assert_eq!(reports.unwrap().len(), 2);
        assert_eq!(seen, vec![("incr", 1), ("incr", 2)]);

        let passes = reg.build(&Pipeline::parse("incr").unwrap()).unwrap();
        let err = PassManager::new(passes).run(&mut c).unwrap_err();
        assert!(
            matches!(err, PassError::Verify { pass: Some(_), .. }),
            "{err}"
        );
        assert!(matches!(
            reg.build(&Pipeline::parse("nope").unwrap()),
            Err(PassError::UnknownPass { .. })
        ));
        assert!(matches!(
            reg.build(&Pipeline::parse("incr{x=1}").unwrap()),
            Err(PassError::BadOption { .. })
        ));
    }
}
