//! Conversions between dlc dialects. For now: the graph dialect to the loop
//! dialect ([`graph_to_loop`]).
#![deny(missing_docs)]

pub mod graph_to_loop;

pub use graph_to_loop::{LowerError, lower_module};
