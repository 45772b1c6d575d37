//! Conversions between dlc dialects: the graph dialect to the loop dialect
//! ([`graph_to_loop`]: fusion, buffer planning), the loop dialect to the
//! tile dialect ([`loop_to_tile`]: schedules for a target description).
#![deny(missing_docs)]

pub mod graph_to_loop;
pub mod loop_to_tile;

pub use graph_to_loop::{LowerError, lower_module};
pub use loop_to_tile::{
    Packing, ScheduleParams, TileConvError, convert_module, convert_module_with, schedule_module,
};
