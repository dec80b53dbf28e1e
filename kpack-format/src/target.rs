//! AMDGPU target IDs (formats.md §2): a processor followed by `:feature+` /
//! `:feature-` settings (`sramecc`, `xnack`). A feature left out means
//! "any". Processors:
//! - `gfx<digits><lowercase letters>` (`gfx90a`, `gfx1100`, `gfx1250`),
//!   known to LLVM or not: new GPUs appear faster than tools are updated,
//!   so any name of this shape is carried through;
//! - generic processors `gfx<major>[-<minor>]-generic` (`gfx11-generic`,
//!   `gfx9-4-generic`);
//! - strict processors `<processor>-strict` (`gfx1250-strict`): the same
//!   ISA with stricter code generation, a target of its own (never merged
//!   with `gfx1250`, never stripped);
//! - `amdgcnspirv`: SPIR-V for AMDGCN (bundle triple
//!   `hip-spirv64-amd-amdhsa--amdgcnspirv`).
//!
//! Printing is canonical: features sorted by name, as LLVM prints them.
//! [`base_arch`] is the processor of a target as artifact and database
//! keys use it.

use std::fmt;
use std::str::FromStr;

/// The prefix the HIP runtime puts before an agent's ISA name.
pub const AGENT_ISA_PREFIX: &str = "amdgcn-amd-amdhsa--";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("empty target ID")]
    Empty,
    #[error("target ID '{0}': processor '{1}' is not a processor name (gfx<digits><letters>, a -generic or -strict one, or amdgcnspirv)")]
    BadProcessor(String, String),
    #[error("target ID '{0}': feature '{1}' must be a name followed by '+' or '-'")]
    BadFeature(String, String),
    #[error("target ID '{0}': feature '{1}' is given twice")]
    DuplicateFeature(String, String),
    #[error("target ID '{0}': more than {MAX_FEATURES} features")]
    TooManyFeatures(String),
}

/// Most features a target ID may set. LLVM knows two (`sramecc`, `xnack`);
/// the bound keeps [`TargetId::compatible_targets`] (2^n targets) small
/// whatever text it is given.
pub(crate) const MAX_FEATURES: usize = 8;

/// A parsed target ID.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TargetId {
    processor: String,
    /// Sorted by name, each name at most once.
    features: Vec<(String, bool)>,
}

impl TargetId {
    /// Parse a target ID such as `gfx942:sramecc+:xnack-`. A leading
    /// `amdgcn-amd-amdhsa--` (as in an agent's ISA name) is accepted and
    /// dropped.
    pub fn parse(text: &str) -> Result<Self, TargetError> {
        let s = text.strip_prefix(AGENT_ISA_PREFIX).unwrap_or(text);
        if s.is_empty() {
            return Err(TargetError::Empty);
        }
        let mut parts = s.split(':');
        let processor = parts.next().unwrap_or_default();
        if !is_processor(processor) {
            return Err(TargetError::BadProcessor(text.into(), processor.into()));
        }
        let mut features: Vec<(String, bool)> = Vec::new();
        for part in parts {
            let (name, on) = match part.as_bytes().last() {
                Some(b'+') => (&part[..part.len() - 1], true),
                Some(b'-') => (&part[..part.len() - 1], false),
                _ => return Err(TargetError::BadFeature(text.into(), part.into())),
            };
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                return Err(TargetError::BadFeature(text.into(), part.into()));
            }
            if features.iter().any(|(n, _)| n == name) {
                return Err(TargetError::DuplicateFeature(text.into(), name.into()));
            }
            if features.len() == MAX_FEATURES {
                return Err(TargetError::TooManyFeatures(text.into()));
            }
            features.push((name.to_string(), on));
        }
        features.sort();
        Ok(TargetId {
            processor: processor.to_string(),
            features,
        })
    }

    pub fn processor(&self) -> &str {
        &self.processor
    }

    /// Feature settings, sorted by name.
    pub fn features(&self) -> &[(String, bool)] {
        &self.features
    }

    /// The setting of one feature, `None` when left out ("any").
    pub fn feature(&self, name: &str) -> Option<bool> {
        self.features
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, on)| on)
    }

    /// Is this a generic processor (`gfx11-generic`, `gfx9-4-generic`)?
    pub fn is_generic(&self) -> bool {
        self.processor.ends_with("-generic")
    }

    /// Is this a strict processor (`gfx1250-strict`)?
    pub fn is_strict(&self) -> bool {
        self.processor.ends_with(STRICT_SUFFIX)
    }

    /// Is this SPIR-V for AMDGCN (`amdgcnspirv`)?
    pub fn is_spirv(&self) -> bool {
        self.processor == SPIRV
    }

    /// Targets whose code objects run on an agent with this target ID, most
    /// specific first: every subset of the features, larger subsets first,
    /// and among subsets of one size in feature-name order. For
    /// `gfx942:sramecc+:xnack-`: itself, `gfx942:sramecc+`, `gfx942:xnack-`,
    /// `gfx942`. (A feature left out of a code object's target means it runs
    /// either way; `xnack+` code never matches an `xnack-` agent.)
    pub fn compatible_targets(&self) -> Vec<TargetId> {
        let n = self.features.len();
        let mut out = Vec::with_capacity(1 << n.min(8));
        for size in (0..=n).rev() {
            for_each_combination(n, size, &mut |idx| {
                out.push(TargetId {
                    processor: self.processor.clone(),
                    features: idx.iter().map(|&i| self.features[i].clone()).collect(),
                });
            });
        }
        out
    }

    /// Does a request for this target (`kpack prune --targets`, `restore
    /// --targets`) take a code object built for `code_object`? The same
    /// processor, and no feature that both set is set differently: a
    /// request leaves what it does not name open, as the loader does for
    /// code objects (`gfx90a` takes `gfx90a`, `gfx90a:xnack+` and
    /// `gfx90a:xnack-`; `gfx90a:xnack-` takes `gfx90a` and `gfx90a:xnack-`,
    /// the code an xnack- device loads, but not `gfx90a:xnack+`).
    pub fn takes(&self, code_object: &TargetId) -> bool {
        self.processor == code_object.processor
            && code_object
                .features
                .iter()
                .all(|(name, on)| self.feature(name).is_none_or(|mine| mine == *on))
    }

    /// Can a code object built for `code_object` run on an agent with this
    /// target ID? Same processor, and every feature the code object sets is
    /// set the same way here.
    pub fn accepts(&self, code_object: &TargetId) -> bool {
        self.processor == code_object.processor
            && code_object
                .features
                .iter()
                .all(|(name, on)| self.feature(name) == Some(*on))
    }
}

/// The processor name of SPIR-V for AMDGCN.
pub const SPIRV: &str = "amdgcnspirv";

/// The suffix of strict processors (`gfx1250-strict`).
pub(crate) const STRICT_SUFFIX: &str = "-strict";

/// `gfx` followed by digits then letters and digits (`gfx90a`, `gfx1250`),
/// that with `-strict`, a generic processor `gfx<major>[-<minor>]-generic`,
/// or `amdgcnspirv`.
fn is_processor(p: &str) -> bool {
    if p == SPIRV {
        return true;
    }
    let Some(rest) = p.strip_prefix("gfx") else {
        return false;
    };
    if let Some(version) = rest.strip_suffix("-generic") {
        return !version.is_empty()
            && version
                .split('-')
                .all(|x| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit()));
    }
    let rest = rest.strip_suffix(STRICT_SUFFIX).unwrap_or(rest);
    !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
        && rest.as_bytes()[0].is_ascii_digit()
}

/// `text` with the `-xnack`/`-sramecc` spellings of features that some
/// database file names use turned into `:xnack`/`:sramecc`
/// (`gfx90a-xnack+` → `gfx90a:xnack+`); a `-strict` suffix stays.
pub fn normalize_feature_spelling(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('-') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let feature = ["xnack", "sramecc"].iter().any(|f| after.starts_with(f));
        out.push(if feature { ':' } else { '-' });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The processor of a target or database key without its features, as
/// artifact splitting keys per-target database artifacts and
/// `--gpu-targets` compares: the `-xnack`/`-sramecc` spellings normalized
/// ([`normalize_feature_spelling`]), then everything from the first `:`
/// cut. `gfx942:sramecc+:xnack-` → `gfx942`, `gfx90a-xnack-` → `gfx90a`,
/// `gfx1250-strict-xnack+` → `gfx1250-strict` (`-strict` is never
/// stripped). Keys that are not target IDs (AOTriton's family keys
/// `gfx11`, `gfx12_0`) come back as they are.
pub fn base_arch(key: &str) -> String {
    let normalized = normalize_feature_spelling(key);
    match normalized.split_once(':') {
        Some((processor, _)) => processor.to_string(),
        None => normalized,
    }
}

/// `text` as a target name in a file name reads: `_strict` is `-strict`
/// (`gfx1250_strict` → `gfx1250-strict`; Composable Kernel and others spell
/// it so), and the `-xnack`/`-sramecc` feature spellings are `:`
/// ([`normalize_feature_spelling`]).
pub fn normalize_name(text: &str) -> String {
    normalize_feature_spelling(&text.replace("_strict", STRICT_SUFFIX))
}

/// Is `key` a family key that is not a target ID (`gfx12_0`, `gfx9_4`:
/// rocm-bootstrap's sub-families, AOTriton's shared images)?
pub fn is_family_key(key: &str) -> bool {
    let Some(rest) = key.strip_prefix("gfx") else {
        return false;
    };
    let mut parts = rest.split('_');
    let all_digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    parts.next().is_some_and(all_digits) && {
        let rest: Vec<&str> = parts.collect();
        !rest.is_empty() && rest.iter().all(|p| all_digits(p))
    }
}

/// What a target named by a user or a config (`--gpu-targets`,
/// `--expect-targets`, an architecture group) selects. Targets are matched
/// as whole target IDs, never as text: `gfx1250` does not select
/// `gfx1250-strict` (nor a file named `..._gfx1250_strict...`), `gfx90`
/// selects nothing but `gfx90`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TargetSelector {
    /// A processor without features (`gfx90a`, `gfx1250-strict`,
    /// `gfx11-generic`): every feature variant of it (`gfx90a`,
    /// `gfx90a:xnack+`, `gfx90a:xnack-`), no other processor.
    Processor(String),
    /// A target ID with features (`gfx90a:xnack-`): exactly that one.
    Exact(TargetId),
    /// A family wildcard `gfx<digits>X` (TheRock's `gfx110X`, `gfx94X`,
    /// `gfx125X`): the processors of that prefix and one more digit or
    /// letter (`gfx125X`: `gfx1250`, `gfx1251`), but no strict or generic
    /// processor, which must be named to be selected.
    Family(String),
    /// A family key that is not a target ID (`gfx12_0`): that key only.
    Key(String),
}

impl TargetSelector {
    /// Parse a selector: a family wildcard (`gfx125X`), a family key
    /// (`gfx12_0`), or a target ID as file names may spell it
    /// ([`normalize_name`]: `gfx1250_strict`, `gfx90a-xnack+`).
    pub fn parse(text: &str) -> Result<Self, TargetError> {
        if let Some(prefix) = text.strip_suffix('X') {
            let digits = prefix.strip_prefix("gfx").unwrap_or("");
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                return Ok(TargetSelector::Family(prefix.to_string()));
            }
        }
        if is_family_key(text) {
            return Ok(TargetSelector::Key(text.to_string()));
        }
        let t = TargetId::parse(&normalize_name(text))?;
        Ok(if t.features.is_empty() {
            TargetSelector::Processor(t.processor)
        } else {
            TargetSelector::Exact(t)
        })
    }

    /// Does this selector take code objects or files of `target`?
    pub fn selects(&self, target: &TargetId) -> bool {
        let p = target.processor();
        match self {
            TargetSelector::Processor(q) => p == q,
            TargetSelector::Exact(t) => t == target,
            TargetSelector::Family(prefix) => {
                !target.is_strict()
                    && !target.is_generic()
                    && p.strip_prefix(prefix.as_str()).is_some_and(|rest| {
                        rest.len() == 1
                            && rest
                                .bytes()
                                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
                    })
            }
            TargetSelector::Key(_) => false,
        }
    }

    /// [`TargetSelector::selects`] for a target or key as spelled in an
    /// artifact, archive or file name (`gfx1250_strict`, `gfx90a-xnack+`,
    /// `gfx12_0`); a name that is neither is selected by nothing.
    pub fn selects_name(&self, name: &str) -> bool {
        if let TargetSelector::Key(k) = self {
            return k == name;
        }
        TargetId::parse(&normalize_name(name)).is_ok_and(|t| self.selects(&t))
    }
}

impl fmt::Display for TargetSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetSelector::Processor(p) => f.write_str(p),
            TargetSelector::Exact(t) => t.fmt(f),
            TargetSelector::Family(prefix) => write!(f, "{prefix}X"),
            TargetSelector::Key(k) => f.write_str(k),
        }
    }
}

fn for_each_combination(n: usize, k: usize, f: &mut dyn FnMut(&[usize])) {
    fn rec(start: usize, n: usize, k: usize, cur: &mut Vec<usize>, f: &mut dyn FnMut(&[usize])) {
        if cur.len() == k {
            f(cur);
            return;
        }
        for i in start..n {
            cur.push(i);
            rec(i + 1, n, k, cur, f);
            cur.pop();
        }
    }
    rec(0, n, k, &mut Vec::with_capacity(k), f)
}

impl fmt::Display for TargetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.processor)?;
        for (name, on) in &self.features {
            write!(f, ":{}{}", name, if *on { '+' } else { '-' })?;
        }
        Ok(())
    }
}

impl FromStr for TargetId {
    type Err = TargetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TargetId::parse(s)
    }
}

/// The target ID part of an offload bundle entry's triple: the text after
/// the last `--` (`hipv4-amdgcn-amd-amdhsa--gfx942:xnack-` → `gfx942:xnack-`).
pub fn target_of_triple(triple: &str) -> &str {
    triple.rfind("--").map(|i| &triple[i + 2..]).unwrap_or("")
}

/// Is this bundle entry triple a host entry (`host-x86_64-unknown-linux--`)?
pub fn is_host_triple(triple: &str) -> bool {
    triple.starts_with("host-")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TargetId {
        TargetId::parse(s).unwrap()
    }

    #[test]
    fn parses_and_prints_canonically() {
        assert_eq!(
            t("gfx942:xnack-:sramecc+").to_string(),
            "gfx942:sramecc+:xnack-"
        );
        assert_eq!(t("gfx1100").to_string(), "gfx1100");
        assert_eq!(t("gfx90a:xnack+").feature("xnack"), Some(true));
        assert_eq!(t("gfx90a").feature("xnack"), None);
        assert_eq!(t("amdgcn-amd-amdhsa--gfx1101").to_string(), "gfx1101");
        assert!(t("gfx9-4-generic").is_generic());
        assert!(t("gfx11-generic:xnack-").is_generic());
        assert!(!t("gfx1100").is_generic());
    }

    /// formats.md §2.1: strict processors, `amdgcnspirv`, and processors LLVM 19
    /// does not know are targets of their own.
    #[test]
    fn strict_spirv_and_unknown_processors() {
        let strict = t("gfx1250-strict:xnack+");
        assert_eq!(strict.processor(), "gfx1250-strict");
        assert!(strict.is_strict() && !strict.is_generic());
        assert_eq!(strict.to_string(), "gfx1250-strict:xnack+");
        assert!(!t("gfx1250").is_strict());
        // Never merged: neither runs the other's code objects.
        assert!(!t("gfx1250").accepts(&t("gfx1250-strict")));
        assert!(!t("gfx1250-strict").accepts(&t("gfx1250")));
        let spirv = t("amdgcnspirv");
        assert!(spirv.is_spirv());
        assert_eq!(
            spirv.compatible_targets(),
            vec![t("amdgcnspirv")],
            "amdgcnspirv is looked up like any other target"
        );
        for unknown in ["gfx1153", "gfx1251", "gfx13000", "gfx90c"] {
            assert_eq!(t(unknown).to_string(), unknown);
        }
        for bad in [
            "gfx-strict",
            "gfx1250-strict-strict",
            "amdgcnspirv2",
            "spirv",
        ] {
            assert!(TargetId::parse(bad).is_err(), "{bad}");
        }
    }

    fn sel(s: &str) -> TargetSelector {
        TargetSelector::parse(s).unwrap()
    }

    /// Whole target IDs: a processor never selects another whose name it
    /// starts, strict targets are their own, `_strict` reads as `-strict`.
    #[test]
    fn selectors_match_whole_target_ids() {
        let g = sel("gfx1250");
        assert!(g.selects_name("gfx1250"));
        assert!(g.selects_name("gfx1250:xnack+"));
        assert!(g.selects_name("gfx1250-xnack-"));
        for other in [
            "gfx1250-strict",
            "gfx1250_strict",
            "gfx1250-strict:xnack+",
            "gfx12500",
            "gfx125",
            "gfx1251",
        ] {
            assert!(!g.selects_name(other), "gfx1250 selects {other}");
        }
        let strict = sel("gfx1250_strict");
        assert_eq!(strict, sel("gfx1250-strict"));
        assert_eq!(strict.to_string(), "gfx1250-strict");
        assert!(strict.selects_name("gfx1250-strict-xnack+"));
        assert!(strict.selects_name("gfx1250_strict"));
        assert!(!strict.selects_name("gfx1250"));
        assert!(!sel("gfx90").selects_name("gfx90a"));
        assert!(!sel("gfx9").selects_name("gfx90a"));
        let exact = sel("gfx90a:xnack-");
        assert!(exact.selects_name("gfx90a:xnack-") && exact.selects_name("gfx90a-xnack-"));
        assert!(!exact.selects_name("gfx90a") && !exact.selects_name("gfx90a:xnack+"));
        let generic = sel("gfx12-generic");
        assert!(generic.selects_name("gfx12-generic"));
        assert!(!generic.selects_name("gfx1201") && !generic.selects_name("gfx1250"));
    }

    /// Family wildcards take the processors of their prefix and one more
    /// character, strict and generic ones only when named.
    #[test]
    fn family_wildcards_leave_strict_targets_out() {
        let f = sel("gfx125X");
        assert_eq!(f.to_string(), "gfx125X");
        assert!(f.selects_name("gfx1250") && f.selects_name("gfx1251:xnack+"));
        assert!(!f.selects_name("gfx1250-strict") && !f.selects_name("gfx1250_strict"));
        assert!(!f.selects_name("gfx12500") && !f.selects_name("gfx1201"));
        let f = sel("gfx94X");
        assert!(f.selects_name("gfx942:sramecc+:xnack-") && !f.selects_name("gfx90a"));
        assert!(sel("gfx90X").selects_name("gfx90a"));
        let key = sel("gfx12_0");
        assert!(key.selects_name("gfx12_0") && !key.selects_name("gfx1200"));
        assert!(!sel("gfx1200").selects_name("gfx12_0"));
        for bad in ["gfxX", "X", "sm_80", "gfx12_", "gfx-strict", ""] {
            assert!(TargetSelector::parse(bad).is_err(), "{bad}");
        }
        assert!(is_family_key("gfx9_4") && !is_family_key("gfx94") && !is_family_key("gfx_4"));
        assert_eq!(
            normalize_name("gfx1250_strict_xnack"),
            "gfx1250-strict_xnack"
        );
    }

    #[test]
    fn base_arch_normalizes_and_keeps_strict() {
        for (key, base) in [
            ("gfx942:sramecc+:xnack-", "gfx942"),
            ("gfx90a-xnack-", "gfx90a"),
            ("gfx90a-xnack+", "gfx90a"),
            ("gfx942-sramecc+-xnack-", "gfx942"),
            ("gfx1250-strict-xnack+", "gfx1250-strict"),
            ("gfx1250-strict", "gfx1250-strict"),
            ("gfx11-generic:xnack-", "gfx11-generic"),
            ("amdgcnspirv", "amdgcnspirv"),
            ("gfx12_0", "gfx12_0"),
            ("gfx11", "gfx11"),
        ] {
            assert_eq!(base_arch(key), base, "{key}");
        }
        assert_eq!(normalize_feature_spelling("gfx90a-xnack+"), "gfx90a:xnack+");
        assert_eq!(
            normalize_feature_spelling("gfx1250-strict-sramecc-"),
            "gfx1250-strict:sramecc-"
        );
    }

    #[test]
    fn rejects_bad_ids() {
        for bad in [
            "",
            "sm_90",
            "gfx",
            "gfx942:xnack",
            "gfx942:xnack+:xnack-",
            "gfx942:+",
            "gfx-generic",
            "GFX900",
        ] {
            assert!(TargetId::parse(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn compatible_targets_most_specific_first() {
        let names: Vec<String> = t("gfx942:sramecc+:xnack-")
            .compatible_targets()
            .iter()
            .map(|x| x.to_string())
            .collect();
        assert_eq!(
            names,
            [
                "gfx942:sramecc+:xnack-",
                "gfx942:sramecc+",
                "gfx942:xnack-",
                "gfx942"
            ]
        );
        let names: Vec<String> = t("gfx1100")
            .compatible_targets()
            .iter()
            .map(|x| x.to_string())
            .collect();
        assert_eq!(names, ["gfx1100"]);
    }

    #[test]
    fn accepts_follows_feature_rules() {
        let agent = t("gfx90a:xnack-");
        assert!(agent.accepts(&t("gfx90a")));
        assert!(agent.accepts(&t("gfx90a:xnack-")));
        assert!(!agent.accepts(&t("gfx90a:xnack+")));
        assert!(!agent.accepts(&t("gfx908")));
        for c in agent.compatible_targets() {
            assert!(agent.accepts(&c));
        }
    }

    #[test]
    fn requests_take_what_the_loader_would() {
        assert!(t("gfx90a").takes(&t("gfx90a:xnack+")));
        assert!(t("gfx90a").takes(&t("gfx90a:xnack-")));
        assert!(t("gfx90a").takes(&t("gfx90a")));
        assert!(t("gfx90a:xnack-").takes(&t("gfx90a")));
        assert!(t("gfx90a:xnack-").takes(&t("gfx90a:xnack-")));
        assert!(!t("gfx90a:xnack-").takes(&t("gfx90a:xnack+")));
        assert!(!t("gfx90a").takes(&t("gfx908")));
        assert!(t("gfx942:sramecc+").takes(&t("gfx942:sramecc+:xnack-")));
        assert!(!t("gfx942:sramecc-").takes(&t("gfx942:sramecc+:xnack-")));
    }

    #[test]
    fn triples() {
        assert_eq!(
            target_of_triple("hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-"),
            "gfx942:sramecc+:xnack-"
        );
        assert_eq!(target_of_triple("hip-amdgcn-amd-amdhsa--gfx906"), "gfx906");
        assert_eq!(
            target_of_triple("hip-spirv64-amd-amdhsa--amdgcnspirv"),
            "amdgcnspirv"
        );
        assert_eq!(target_of_triple("host-x86_64-unknown-linux--"), "");
        assert!(is_host_triple("host-x86_64-unknown-linux"));
        assert!(!is_host_triple("hipv4-amdgcn-amd-amdhsa--gfx906"));
    }
}
