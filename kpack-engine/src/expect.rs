//! `--expect-targets` (split, recombine, split-wheels, verify): the one
//! check that a run is about to build a complete set, not a partial one.
//! Every target listed must be in the inputs with code objects; a target
//! missing, or present only with database files, fails the run before its
//! first output file is created, naming the target and the input.
//!
//! Each command gathers what its inputs hold into a [`Present`] (the fat
//! binaries' targets, [`Present::add_tree`] for trees of files), then
//! calls [`check`]. Targets are matched as whole target IDs
//! ([`TargetSelector`]): `gfx1250` is not satisfied by `gfx1250-strict`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::databases::{classify, Database};
use crate::input::map_file;
use crate::pack::{fatbin_section, read_head};
use crate::target::{target_of_triple, TargetSelector};
use crate::tree::{scan, NodeKind};
use crate::{ArtifactError, Result};
use kpack_bundle::list_fatbin;
use kpack_host::binary::{classify_parsed, could_be_binary, Class};
use kpack_host::WithPath;

/// The targets the inputs of a run hold: target (or database key) ->
/// whether code objects for it were found (`false`: only database files).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Present {
    targets: BTreeMap<String, bool>,
}

impl Present {
    /// `target` is in the inputs, with code objects or not.
    pub fn add(&mut self, target: &str, code_objects: bool) {
        *self.targets.entry(target.to_string()).or_default() |= code_objects;
    }

    /// The targets of the code objects of the fat binary at `path` (a file
    /// that is not a fat binary adds nothing).
    pub fn add_binary(&mut self, path: &Path) -> Result<()> {
        if !could_be_binary(&read_head(path)?) {
            return Ok(());
        }
        let mapped = map_file(path)?;
        let classified = classify_parsed(&mapped);
        if classified.class != Class::Fat {
            return Ok(());
        }
        let section = fatbin_section(path, &classified)?;
        for b in list_fatbin(section).with_path(path)? {
            for e in b.device_entries() {
                self.add(target_of_triple(&e.triple), true);
            }
        }
        Ok(())
    }

    /// Every file below `root`: database files (the first of `databases`
    /// that claims one, by its path relative to `root`) add their target
    /// without code objects, fat binaries their code objects' targets.
    /// `keep` leaves out what a run drops (`--gpu-targets`).
    pub fn add_tree(
        &mut self,
        root: &Path,
        databases: &[Database],
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<()> {
        let mut found = Present::default();
        for n in scan(root)? {
            if !matches!(n.kind, NodeKind::File { .. }) {
                continue;
            }
            match classify(databases, &n.rel_str(root)?) {
                Some(claim) => found.add(&claim.base, false),
                None => found.add_binary(&root.join(&n.rel))?,
            }
        }
        for (t, code_objects) in found.targets {
            if keep(&t) {
                self.add(&t, code_objects);
            }
        }
        Ok(())
    }

    /// The targets, sorted.
    pub fn targets(&self) -> impl Iterator<Item = &str> + '_ {
        self.targets.keys().map(String::as_str)
    }
}

/// The targets of `--expect-targets`, each a [`TargetSelector`].
pub fn parse(expected: &[String]) -> Result<Vec<TargetSelector>> {
    expected
        .iter()
        .map(|t| {
            TargetSelector::parse(t).map_err(|e| ArtifactError::BadExpectTargets {
                what: format!("{t:?}: {e}"),
            })
        })
        .collect()
}

/// Fail unless every target of `expected` selects a target with code
/// objects in `present`. `output` says what would have been partial
/// (`device wheel set`), `input` where the targets were looked for.
pub fn check(
    expected: &[String],
    present: &Present,
    output: &'static str,
    input: &Path,
) -> Result<()> {
    for (text, selector) in expected.iter().zip(parse(expected)?) {
        let mut matched = present
            .targets
            .iter()
            .filter(|(t, _)| selector.selects_name(t));
        let first = matched.clone().next();
        if matched.any(|(_, code_objects)| *code_objects) {
            continue;
        }
        let found = match first {
            None => "no code object for it".to_string(),
            Some((t, _)) => format!("no code object for it (only database files of {t})"),
        };
        return Err(ArtifactError::ExpectedTarget {
            output,
            target: text.clone(),
            found,
            input: input.to_path_buf(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn present(items: &[(&str, bool)]) -> Present {
        let mut p = Present::default();
        for (t, c) in items {
            p.add(t, *c);
        }
        p
    }

    fn check_of(expected: &[&str], p: &Present) -> Result<()> {
        let expected: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        check(&expected, p, "device wheel set", Path::new("IN"))
    }

    #[test]
    fn every_expected_target_needs_code_objects() {
        let p = present(&[
            ("gfx90a:xnack-", true),
            ("gfx1250-strict", true),
            ("gfx1201", false),
        ]);
        check_of(&["gfx90a", "gfx90a:xnack-", "gfx1250_strict"], &p).unwrap();
        let e = check_of(&["gfx90a", "gfx1250"], &p)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "refusing to build a partial device wheel set: gfx1250 expected but no code object for it in IN"
        );
        let e = check_of(&["gfx1201"], &p).unwrap_err().to_string();
        assert!(
            e.contains(
                "gfx1201 expected but no code object for it (only database files of gfx1201)"
            ),
            "{e}"
        );
        let e = check_of(&["gfx90a:xnack+"], &p).unwrap_err().to_string();
        assert!(e.contains("gfx90a:xnack+ expected"), "{e}");
        let e = check_of(&["sm_80"], &p).unwrap_err().to_string();
        assert!(e.starts_with("--expect-targets: \"sm_80\""), "{e}");
        // A code object found later for a database-only target counts.
        let mut p = p;
        p.add("gfx1201", true);
        check_of(&["gfx1201"], &p).unwrap();
    }
}
