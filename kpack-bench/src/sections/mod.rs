//! The sections of the table, one module each. Each module declares its
//! [`Section`] with `section!`: the name `--only` takes,
//! a line on what it measures, and the function returning its rows;
//! [`SECTIONS`] lists them in the order they run, and `--only` and its help
//! are made from it. `libs` declares two (`rocrand` and `rocsparse`: split
//! and offload of a ROCm library, and the floors on the same bytes).
//!
//! `job` is the measured process the `host` and `xla` sections share.

/// `section!(name, about, run)`: the module's [`Section`], `SECTION`, and
/// its name, `NAME`.
macro_rules! section {
    ($name:literal, $about:literal, $run:expr) => {
        /// This module's section of the table.
        pub const SECTION: $crate::sections::Section = $crate::sections::Section {
            name: NAME,
            about: $about,
            run: $run,
        };
        /// The section's name: its rows' `section`.
        #[allow(dead_code)]
        const NAME: &str = $name;
    };
}

mod compressed;
mod digest;
mod doctor;
mod host;
mod job;
pub mod large;
mod libs;
mod pipeline;
mod python;
pub mod python_upstream;
mod rewrite;
mod runtime;
mod split_wheels;
mod wheels;
mod xla;

use anyhow::Result;
use clap::builder::{PossibleValue, PossibleValuesParser};

use crate::context::Ctx;
use crate::report::Row;

/// One section of the table.
#[derive(Clone, Copy)]
pub struct Section {
    /// Its name: the `section` of its rows, what `--only` takes.
    pub name: &'static str,
    /// What it measures, in a line (`--help`).
    pub about: &'static str,
    /// Measures it: its rows.
    pub run: fn(&Ctx) -> Result<Vec<Row>>,
}

/// Every section, in the order they run.
pub const SECTIONS: &[Section] = &[
    libs::ROCRAND,
    libs::ROCSPARSE,
    pipeline::SECTION,
    runtime::SECTION,
    large::SECTION,
    rewrite::SECTION,
    wheels::SECTION,
    python::SECTION,
    python_upstream::SECTION,
    compressed::SECTION,
    host::SECTION,
    xla::SECTION,
    doctor::SECTION,
    digest::SECTION,
];

/// What `--only` accepts: the sections' names, each with its line.
pub fn names() -> PossibleValuesParser {
    PossibleValuesParser::new(
        SECTIONS
            .iter()
            .map(|s| PossibleValue::new(s.name).help(s.about)),
    )
}

/// The rows of the sections wanted (all when `only` is empty), in order.
pub fn run(ctx: &Ctx, only: &[String]) -> Result<Vec<Row>> {
    let wanted = |s: &Section| only.is_empty() || only.iter().any(|o| o == s.name);
    let mut rows = Vec::new();
    for s in SECTIONS.iter().filter(|s| wanted(s)) {
        eprintln!("== {}", s.name);
        rows.extend((s.run)(ctx)?);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `section!` in this directory is in [`SECTIONS`], once, and
    /// every section in it was declared by one or is one of `libs`' pair.
    #[test]
    fn every_declared_section_runs() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/sections");
        let mut declared = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
            for part in text.split("section!(\n").skip(1) {
                let name = part.trim_start().trim_start_matches('"');
                declared.push(name[..name.find('"').unwrap()].to_string());
            }
        }
        declared.extend([libs::ROCRAND.name.into(), libs::ROCSPARSE.name.into()]);
        declared.sort();
        let mut listed: Vec<String> = SECTIONS.iter().map(|s| s.name.to_string()).collect();
        listed.sort();
        assert_eq!(declared, listed);
    }
}
