//! What a [`FatbinStream`] hands out, and which entries it takes.

use std::ops::Range;

use super::Blob;
#[cfg(doc)]
use super::FatbinStream;

/// One device code object handed out by [`FatbinStream`] (or a host
/// entry, when [`FatbinStream::with_host_entries`] asks for them).
#[derive(Debug, Clone)]
pub struct Streamed<'a> {
    /// Bundle index (formats.md §1.4).
    pub bundle: usize,
    /// Byte range in the input of this bundle, or of the compressed bundle
    /// it came from.
    pub range: Range<usize>,
    /// Whether it came out of a compressed bundle (then `data` is its own
    /// buffer; otherwise a slice of the input).
    pub compressed: bool,
    /// Its position in its bundle's entry table.
    pub entry: usize,
    pub triple: String,
    /// Its offset from the start of its (uncompressed) bundle.
    pub offset: u64,
    pub data: Blob<'a>,
}

impl Streamed<'_> {
    /// The target ID as written in the triple.
    pub fn target(&self) -> &str {
        kpack_format::target::target_of_triple(&self.triple)
    }
}

/// Which targets' code objects to hand out.
type Keep<'a> = Box<dyn Fn(&str) -> bool + Send + 'a>;

/// Which entries a [`FatbinStream`] hands out.
#[derive(Default)]
pub(super) struct Filter<'a> {
    /// Device entries of the targets it accepts (all without it).
    pub(super) keep: Option<Keep<'a>>,
    /// Host entries too.
    pub(super) hosts: bool,
}

impl Filter<'_> {
    /// Whether an entry (a host entry, or one for `target`) is handed out.
    pub(super) fn takes(&self, host: bool, target: &str) -> bool {
        if host {
            self.hosts
        } else {
            self.keep.as_ref().is_none_or(|k| k(target))
        }
    }
}
