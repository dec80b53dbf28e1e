//! kpack-engine: the packing engine.
#![deny(unsafe_code)]

pub mod artifact;
pub mod size;
pub mod wheel;

use kpack_format::{archive, hipk, msgpack, target};
use kpack_loader::{self as loader, input};
