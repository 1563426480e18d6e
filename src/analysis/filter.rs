//! Trace filters with `tracemalloc`'s matching rules, compiled once and evaluated per distinct
//! frame and traceback rather than per trace.
//!
//! Filename patterns follow Python's `fnmatch` on POSIX: `*`, `?` and `[...]` classes (with `!`
//! negation) are special, everything else (braces, backslashes, `^`...) is literal, and the
//! whole filename must match. A `.pyc` suffix is read as `.py` on both pattern and filename.
//! Patterns are translated into an equivalent `globset` glob with every literal escaped; the
//! translation is kept in [`fnmatch_to_glob`] and tested against what Python answers.
//!
//! [`FilterSet`] is also the matcher the live tracer uses for trace-time filters:
//! build it once with [`FilterSet::new`] and call [`FilterSet::keep`] per captured stack.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use globset::{GlobBuilder, GlobMatcher};
use parking_lot::Mutex;

use crate::analysis::snapshot::{Kinds, SiteRetention, Snapshot, SnapshotBuilder};
use crate::error::{Error, Result};
use crate::platform::fallible;

/// One filter, as `tracemalloc.Filter` / `tracemalloc.DomainFilter` describe it.
#[derive(Clone, Debug, PartialEq)]
pub enum FilterSpec {
    /// `Filter(inclusive, filename_pattern, lineno, all_frames, domain)`; the pattern is the
    /// surrogatepass UTF-8 of the Python string.
    Filename {
        inclusive: bool,
        pattern: Vec<u8>,
        lineno: Option<u32>,
        all_frames: bool,
        domain: Option<u32>,
    },
    /// `DomainFilter(inclusive, domain)`.
    Domain { inclusive: bool, domain: u32 },
}

impl FilterSpec {
    fn inclusive(&self) -> bool {
        match self {
            FilterSpec::Filename { inclusive, .. } | FilterSpec::Domain { inclusive, .. } => {
                *inclusive
            }
        }
    }
}

/// One element of a parsed `fnmatch` pattern, over code points.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Lit(u32),
    Any,
    Star,
    /// Inclusive code point ranges; an empty unnegated class matches nothing.
    Class {
        negated: bool,
        ranges: Vec<(u32, u32)>,
    },
}

impl Tok {
    fn matches(&self, cp: u32) -> bool {
        match self {
            Tok::Lit(c) => *c == cp,
            Tok::Any => true,
            Tok::Star => false,
            Tok::Class { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= cp && cp <= hi) != *negated
            }
        }
    }
}

/// A compiled filename pattern.
///
/// globset compiles to a byte regex, in which `?` and classes see bytes, not characters. That
/// is exact for ASCII filenames, and for any filename when the pattern has only literals and
/// `*` (UTF-8 is self-synchronising). Other cases (a non-ASCII filename meeting `?` or a class,
/// or a pattern with a lone surrogate, which no glob can spell) use `exact`, a direct
/// code-point matcher with the same semantics.
#[derive(Clone, Debug)]
struct Pattern {
    glob: Option<GlobMatcher>,
    glob_exact_for_any_name: bool,
    tokens: Vec<Tok>,
}

impl Pattern {
    fn is_match(&self, filename: &[u8]) -> bool {
        let name = normalize_pyc(filename);
        match &self.glob {
            Some(g) if self.glob_exact_for_any_name || name.is_ascii() => {
                g.is_match(bytes_as_path(name))
            }
            _ => wild_match(&self.tokens, &code_points(name)),
        }
    }
}

/// Classic single-star backtracking wildcard match: linear in practice, never exponential.
fn wild_match(toks: &[Tok], s: &[u32]) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if p < toks.len() && toks[p].matches(s[i]) {
            p += 1;
            i += 1;
        } else if p < toks.len() && toks[p] == Tok::Star {
            star = Some((p, i));
            p += 1;
        } else if let Some((sp, si)) = star {
            p = sp + 1;
            i = si + 1;
            star = Some((sp, si + 1));
        } else {
            return false;
        }
    }
    toks[p..].iter().all(|t| *t == Tok::Star)
}

#[cfg(unix)]
fn bytes_as_path(bytes: &[u8]) -> &std::path::Path {
    use std::os::unix::ffi::OsStrExt;
    std::path::Path::new(std::ffi::OsStr::from_bytes(bytes))
}

#[cfg(not(unix))]
fn bytes_as_path(bytes: &[u8]) -> &std::path::Path {
    std::path::Path::new(std::str::from_utf8(bytes).unwrap_or(""))
}

/// `tracemalloc` compares `a.pyc` as `a.py` (and only `.pyc`: `.pyo` stays as it is), which is
/// dropping the last byte.
fn normalize_pyc(name: &[u8]) -> &[u8] {
    if name.ends_with(b".pyc") {
        &name[..name.len() - 1]
    } else {
        name
    }
}

/// Compiled patterns are shared: filters are rebuilt on every `filter_traces` call and the
/// tracer's filters may be set repeatedly with the same few patterns. Bounded so that a
/// program generating patterns cannot grow it without limit.
///
/// Only ever try-locked, and never held while compiling: a cache someone else holds is
/// skipped (the pattern is compiled uncached). A forked child inherits the lock as it was at
/// the fork, held by a thread that does not exist there if one was inside; waiting for it
/// would hang the child's first filter, and parking on it would leave `parking_lot_core`
/// state behind (see [`crate::platform::nopark`]).
static PATTERN_CACHE: Mutex<Option<HashMap<Vec<u8>, Arc<Pattern>>>> = Mutex::new(None);
const PATTERN_CACHE_MAX: usize = 256;

fn compile_pattern(pattern: &[u8]) -> Result<Arc<Pattern>> {
    if let Some(mut cache) = PATTERN_CACHE.try_lock() {
        if let Some(p) = cache.get_or_insert_with(HashMap::new).get(pattern) {
            return Ok(p.clone());
        }
    }
    let tokens = parse_fnmatch(normalize_pyc(pattern));
    let glob = match glob_from_tokens(&tokens) {
        None => None,
        Some(glob) => Some(
            GlobBuilder::new(&glob)
                .literal_separator(false)
                .backslash_escape(true)
                .empty_alternates(true)
                .build()
                .map_err(|e| {
                    Error::InvalidArgument(format!(
                        "cannot compile filename pattern {:?}: {e}",
                        String::from_utf8_lossy(pattern)
                    ))
                })?
                .compile_matcher(),
        ),
    };
    let compiled = Arc::new(Pattern {
        glob,
        glob_exact_for_any_name: tokens.iter().all(|t| matches!(t, Tok::Lit(_) | Tok::Star)),
        tokens,
    });
    if let Some(mut cache) = PATTERN_CACHE.try_lock() {
        let cache = cache.get_or_insert_with(HashMap::new);
        if cache.len() >= PATTERN_CACHE_MAX {
            cache.clear();
        }
        cache.insert(pattern.to_vec(), compiled.clone());
    }
    Ok(compiled)
}

/// Decodes surrogatepass UTF-8 into code points (lone surrogates included); bytes that are not
/// part of a valid sequence come out as U+FFFD so that decoding never fails.
fn code_points(bytes: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let (cp, len) = decode_one(&bytes[i..]).unwrap_or((0xFFFD, 1));
        out.push(cp);
        i += len;
    }
    out
}

/// Decodes one code point of UTF-8 in which surrogates are allowed.
pub(crate) fn decode_one(b: &[u8]) -> Option<(u32, usize)> {
    let lead = *b.first()?;
    let (len, init) = match lead {
        0x00..=0x7F => return Some((lead as u32, 1)),
        0xC2..=0xDF => (2, (lead & 0x1F) as u32),
        0xE0..=0xEF => (3, (lead & 0x0F) as u32),
        0xF0..=0xF4 => (4, (lead & 0x07) as u32),
        _ => return None,
    };
    if b.len() < len {
        return None;
    }
    let mut cp = init;
    for &c in &b[1..len] {
        if c & 0xC0 != 0x80 {
            return None;
        }
        cp = (cp << 6) | (c & 0x3F) as u32;
    }
    let min = [0, 0, 0x80, 0x800, 0x10000][len];
    if cp < min || cp > 0x10FFFF {
        return None;
    }
    Some((cp, len))
}

/// True if `bytes` is UTF-8 with lone surrogates allowed (what Python's `surrogatepass`
/// produces and accepts).
pub fn is_surrogatepass_utf8(bytes: &[u8]) -> bool {
    if std::str::from_utf8(bytes).is_ok() {
        return true;
    }
    let mut i = 0;
    while i < bytes.len() {
        match decode_one(&bytes[i..]) {
            Some((_, len)) => i += len,
            None => return false,
        }
    }
    true
}

/// Parses an `fnmatch` pattern (surrogatepass UTF-8) with Python's rules on POSIX.
fn parse_fnmatch(pattern: &[u8]) -> Vec<Tok> {
    let p = code_points(pattern);
    let n = p.len();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < n {
        let c = p[i];
        i += 1;
        if c == '*' as u32 {
            // A run of `*` is one `*` to fnmatch (and `**` means something else to globset).
            if toks.last() != Some(&Tok::Star) {
                toks.push(Tok::Star);
            }
        } else if c == '?' as u32 {
            toks.push(Tok::Any);
        } else if c == '[' as u32 {
            // An optional `!`, then a `]` right there is a member; the class ends at the next
            // `]`. Without one, the `[` is literal.
            let mut j = i;
            if j < n && p[j] == '!' as u32 {
                j += 1;
            }
            if j < n && p[j] == ']' as u32 {
                j += 1;
            }
            while j < n && p[j] != ']' as u32 {
                j += 1;
            }
            if j >= n {
                toks.push(Tok::Lit(c));
                continue;
            }
            let content = &p[i..j];
            i = j + 1;
            let (negated, body) = match content.first() {
                Some(&b) if b == '!' as u32 => (true, &content[1..]),
                _ => (false, content),
            };
            let ranges = class_ranges(body);
            if negated && ranges.is_empty() {
                toks.push(Tok::Any);
            } else {
                toks.push(Tok::Class { negated, ranges });
            }
        } else {
            toks.push(Tok::Lit(c));
        }
    }
    toks
}

fn push_literal(out: &mut String, c: char) {
    if !c.is_ascii_alphanumeric() {
        out.push('\\');
    }
    out.push(c);
}

/// The globset glob (for `literal_separator(false)` and `backslash_escape(true)`) equivalent
/// to parsed tokens, or `None` where no glob can say it (a lone surrogate, an empty class):
/// then only the exact matcher is used.
fn glob_from_tokens(toks: &[Tok]) -> Option<String> {
    let mut out = String::new();
    for t in toks {
        match t {
            Tok::Lit(c) => push_literal(&mut out, char::from_u32(*c)?),
            Tok::Any => out.push('?'),
            Tok::Star => out.push('*'),
            Tok::Class { negated, ranges } => {
                if ranges.is_empty() || ranges.iter().any(|&(lo, hi)| lo <= 0xDFFF && hi >= 0xD800)
                {
                    return None;
                }
                push_class(&mut out, ranges, *negated);
            }
        }
    }
    Some(out)
}

/// The globset glob for an `fnmatch` pattern, for tests and diagnostics.
pub fn fnmatch_to_glob(pattern: &[u8]) -> Option<String> {
    glob_from_tokens(&parse_fnmatch(pattern))
}

/// The members of a class body as inclusive code point ranges: `a-z` is a range when the `-`
/// has a character on both sides, a range whose start is above its end is dropped (as
/// `fnmatch` drops it), and a `-` first or last is literal.
fn class_ranges(body: &[u32]) -> Vec<(u32, u32)> {
    let dash = '-' as u32;
    let mut ranges = Vec::new();
    let mut k = 0;
    while k < body.len() {
        if k + 2 < body.len() && body[k + 1] == dash {
            let (lo, hi) = (body[k], body[k + 2]);
            if lo <= hi {
                ranges.push((lo, hi));
            }
            k += 3;
        } else {
            ranges.push((body[k], body[k]));
            k += 1;
        }
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match merged.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}

/// Writes a class in globset syntax. globset reads `]` first and `-` first or last as
/// literals, and `!`/`^` first as negation, so those characters are split out of ranges and
/// placed where they cannot be misread. Surrogate code points cannot be written in a glob and
/// are left out of the class (a documented difference for lone surrogates in filenames).
fn push_class(out: &mut String, ranges: &[(u32, u32)], negated: bool) {
    let mut pieces: Vec<(u32, u32)> = ranges.to_vec();
    let has = |c: char, pieces: &mut Vec<(u32, u32)>| {
        let cp = c as u32;
        let found = pieces.iter().any(|&(l, h)| l <= cp && cp <= h);
        *pieces = subtract(pieces, cp, cp);
        found
    };
    let rbracket = has(']', &mut pieces);
    let dash = has('-', &mut pieces);
    let bang = has('!', &mut pieces);
    let caret = has('^', &mut pieces);
    let mut members = String::new();
    for &(lo, hi) in &pieces {
        if let (Some(l), Some(h)) = (char::from_u32(lo), char::from_u32(hi)) {
            members.push(l);
            if h != l {
                members.push('-');
                members.push(h);
            }
        }
    }
    if !negated && !rbracket && !dash && members.is_empty() {
        // Only `!` and/or `^`, which cannot open an unnegated class: use literals.
        out.push_str(match (bang, caret) {
            (true, true) => "{\\!,\\^}",
            (true, false) => "\\!",
            _ => "\\^",
        });
        return;
    }
    out.push('[');
    if negated {
        out.push('!');
    }
    let mut dash_done = false;
    if rbracket {
        out.push(']');
    } else if !negated && members.is_empty() && dash {
        // `-` first is literal and keeps `!`/`^` off the front.
        out.push('-');
        dash_done = true;
    }
    out.push_str(&members);
    if bang {
        out.push('!');
    }
    if caret {
        out.push('^');
    }
    if dash && !dash_done {
        out.push('-');
    }
    out.push(']');
}

fn subtract(ranges: &[(u32, u32)], a: u32, b: u32) -> Vec<(u32, u32)> {
    let mut out = Vec::with_capacity(ranges.len() + 1);
    for &(l, h) in ranges {
        if h < a || l > b {
            out.push((l, h));
            continue;
        }
        if l < a {
            out.push((l, a - 1));
        }
        if h > b {
            out.push((b + 1, h));
        }
    }
    out
}

/// Whether `filename` matches the `fnmatch` pattern as `tracemalloc.Filter` reads it (`.pyc`
/// normalised on both sides), with the same compiled-pattern cache the filters use.
pub fn filename_matches(pattern: &[u8], filename: &[u8]) -> Result<bool> {
    Ok(compile_pattern(pattern)?.is_match(filename))
}

/// A compiled filter.
#[derive(Clone, Debug)]
enum Compiled {
    Filename {
        inclusive: bool,
        pattern: Arc<Pattern>,
        lineno: Option<u32>,
        all_frames: bool,
        domain: Option<u32>,
    },
    Domain {
        inclusive: bool,
        domain: u32,
    },
}

/// A list of filters with `Snapshot.filter_traces` semantics: a trace is kept if it matches at
/// least one inclusive filter (when there is any) and every exclusive filter.
///
/// Usable at trace time: [`FilterSet::keep`] takes the domain and the frames of one allocation
/// (most recent first, as captured). It costs one compiled-glob match per filename filter and
/// frame tested and allocates nothing, except for a non-ASCII filename meeting a pattern with
/// `?` or `[...]` (matched by code point). At trace time, cache its answer per traceback rather
/// than calling it per allocation where possible.
#[derive(Clone, Debug)]
pub struct FilterSet {
    filters: Vec<Compiled>,
    has_inclusive: bool,
}

impl FilterSet {
    /// Compiles the filters (patterns come from a shared cache).
    pub fn new(specs: &[FilterSpec]) -> Result<Self> {
        let mut filters = Vec::with_capacity(specs.len());
        for spec in specs {
            filters.push(match spec {
                FilterSpec::Filename {
                    inclusive,
                    pattern,
                    lineno,
                    all_frames,
                    domain,
                } => Compiled::Filename {
                    inclusive: *inclusive,
                    pattern: compile_pattern(pattern)?,
                    lineno: *lineno,
                    all_frames: *all_frames,
                    domain: *domain,
                },
                FilterSpec::Domain { inclusive, domain } => Compiled::Domain {
                    inclusive: *inclusive,
                    domain: *domain,
                },
            });
        }
        Ok(Self {
            has_inclusive: specs.iter().any(FilterSpec::inclusive),
            filters,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// Whether an allocation in `domain` with these frames (most recent first) is kept.
    pub fn keep(&self, domain: u32, frames: &[(&[u8], u32)]) -> bool {
        self.keep_with(domain, |i| {
            traceback_matches(&self.filters[i], frames.len(), |k| {
                let (name, line) = frames[k];
                frame_matches(&self.filters[i], name, line)
            })
        })
    }

    /// The combination rule, given the traceback result of filter `i` (only asked for
    /// filename filters).
    fn keep_with(&self, domain: u32, mut traceback_result: impl FnMut(usize) -> bool) -> bool {
        let mut any_inclusive = false;
        for (i, f) in self.filters.iter().enumerate() {
            let (inclusive, matched) = match f {
                Compiled::Domain {
                    inclusive,
                    domain: d,
                } => (*inclusive, (domain == *d) == *inclusive),
                Compiled::Filename {
                    inclusive,
                    domain: d,
                    ..
                } => {
                    let res = traceback_result(i);
                    let matched = match d {
                        None => res,
                        Some(d) if *inclusive => res && domain == *d,
                        Some(d) => res || domain != *d,
                    };
                    (*inclusive, matched)
                }
            };
            if inclusive {
                any_inclusive |= matched;
            } else if !matched {
                return false;
            }
        }
        !self.has_inclusive || any_inclusive
    }
}

/// `Filter._match_frame_impl`: pattern and line, before inclusive/exclusive is applied.
fn frame_matches(f: &Compiled, filename: &[u8], lineno: u32) -> bool {
    match f {
        Compiled::Filename {
            pattern, lineno: l, ..
        } => pattern.is_match(filename) && l.is_none_or(|l| l == lineno),
        Compiled::Domain { .. } => true,
    }
}

/// `Filter._match_traceback`, given whether frame `k` (most recent first) matches. An empty
/// traceback matches no pattern.
fn traceback_matches(f: &Compiled, nframes: usize, mut frame: impl FnMut(usize) -> bool) -> bool {
    let Compiled::Filename {
        inclusive,
        all_frames,
        ..
    } = f
    else {
        return true;
    };
    let hit = if *all_frames {
        (0..nframes).any(&mut frame)
    } else {
        nframes > 0 && frame(0)
    };
    hit == *inclusive
}

/// `Snapshot.filter_traces`: a new snapshot with the kept traces, in their original order.
///
/// Patterns are evaluated once per distinct filename, frames once per distinct frame and
/// tracebacks once per distinct traceback; the per-trace work is a table lookup and the domain
/// test.
pub fn filter_snapshot(snapshot: &Snapshot, set: &FilterSet) -> Result<Snapshot> {
    let nf = set.filters.len();
    // Per filter: which frames match the pattern and line (empty for domain filters).
    let mut frame_hit: Vec<Vec<bool>> = fallible::with_capacity(nf)?;
    for f in &set.filters {
        match f {
            Compiled::Filename { pattern, .. } => {
                let names = fallible::collect_n(
                    snapshot.filenames.iter().map(|n| pattern.is_match(n)),
                    snapshot.filenames.len(),
                )?;
                let hits = snapshot.frames.iter().map(|fr| {
                    names[fr.filename as usize]
                        && match f {
                            Compiled::Filename { lineno, .. } => {
                                lineno.is_none_or(|l| l == fr.lineno)
                            }
                            Compiled::Domain { .. } => true,
                        }
                });
                frame_hit.push(fallible::collect_n(hits, snapshot.frames.len())?);
            }
            Compiled::Domain { .. } => frame_hit.push(Vec::new()),
        }
    }
    // Per traceback and filter: `_match_traceback`.
    let mut tb_hit = fallible::filled(snapshot.tracebacks.len() * nf, false)?;
    for (t, tb) in snapshot.tracebacks.iter().enumerate() {
        for (i, f) in set.filters.iter().enumerate() {
            tb_hit[t * nf + i] =
                traceback_matches(f, tb.frames.len(), |k| frame_hit[i][tb.frames[k] as usize]);
        }
    }
    let mut out = Snapshot {
        filenames: fallible::cloned(&snapshot.filenames)?,
        frames: fallible::cloned(&snapshot.frames)?,
        functions: fallible::cloned(&snapshot.functions)?,
        traceback_functions: fallible::cloned(&snapshot.traceback_functions)?,
        tracebacks: fallible::cloned(&snapshot.tracebacks)?,
        traces: Vec::new(),
        domains: Default::default(),
        blocks: None,
        peak: None,
        traceback_limit: snapshot.traceback_limit,
        metadata: snapshot.metadata.clone(),
        sample_interval: snapshot.sample_interval,
        kinds: None,
        retention: None,
    };
    let keep = snapshot
        .traces
        .iter()
        .zip(snapshot.domains.iter())
        .map(|(tr, domain)| {
            let base = tr.traceback as usize * nf;
            set.keep_with(domain, |i| tb_hit[base + i])
        });
    let keep = fallible::collect_n(keep, snapshot.traces.len())?;
    let nkept = keep.iter().filter(|&&k| k).count();
    out.traces = fallible::collect_n(kept(snapshot.traces.iter().copied(), &keep), nkept)?;
    // Domains and object kinds stay aligned with the traces kept.
    out.domains = kept(snapshot.domains.iter(), &keep).collect();
    out.blocks = match &snapshot.blocks {
        Some(blocks) => Some(fallible::collect_n(
            kept(blocks.iter().copied(), &keep),
            nkept,
        )?),
        None => None,
    };
    out.kinds = match &snapshot.kinds {
        Some(kinds) => Some(Kinds {
            names: kinds.names.clone(),
            of_trace: fallible::collect_n(kept(kinds.of_trace.iter().copied(), &keep), nkept)?,
        }),
        None => None,
    };
    out.retention = snapshot
        .retention
        .as_ref()
        .map(|reports| reports_of_kept_sites(snapshot, reports, &keep));
    compact(out)
}

/// The items whose entry in `keep` is true, in order.
fn kept<'a, T: 'a>(
    items: impl Iterator<Item = T> + 'a,
    keep: &'a [bool],
) -> impl Iterator<Item = T> + 'a {
    items.zip(keep).filter(|&(_, &k)| k).map(|(item, _)| item)
}

/// The retention reports of the sites a filtered snapshot still shows: a report stays when at
/// least one kept trace was allocated at its site (the most recent frame of its traceback),
/// so `referrer_paths` answers for every line `statistics('lineno')` can list and for no
/// line the filters removed. The reports themselves are kept whole: they describe every
/// object of the site at capture time, which no trace filter changes. `keep` has one entry
/// per trace of `snapshot`.
pub fn reports_of_kept_sites(
    snapshot: &Snapshot,
    reports: &[SiteRetention],
    keep: &[bool],
) -> Vec<SiteRetention> {
    let mut site_kept = vec![false; snapshot.frames.len()];
    for tr in kept(snapshot.traces.iter(), keep) {
        if let Some(&f) = snapshot.tracebacks[tr.traceback as usize].frames.first() {
            site_kept[f as usize] = true;
        }
    }
    let sites: HashSet<(&[u8], u32)> = kept(snapshot.frames.iter(), &site_kept)
        .map(|fr| (&*snapshot.filenames[fr.filename as usize], fr.lineno))
        .collect();
    reports
        .iter()
        .filter(|r| sites.contains(&(&*r.filename, r.lineno)))
        .cloned()
        .collect()
}

/// Drops the filenames, frames and tracebacks no trace refers to any more, so a filtered
/// snapshot is as small as one built from its traces.
pub fn compact(snapshot: Snapshot) -> Result<Snapshot> {
    let mut used = fallible::filled(snapshot.tracebacks.len(), false)?;
    for tr in &snapshot.traces {
        used[tr.traceback as usize] = true;
    }
    if used.iter().all(|&u| u) {
        return Ok(snapshot);
    }
    let mut b = SnapshotBuilder::new(snapshot.traceback_limit);
    let mut tb_map = fallible::filled(snapshot.tracebacks.len(), u32::MAX)?;
    let mut frames = Vec::new();
    for t in 0..snapshot.tracebacks.len() {
        if used[t] {
            tb_map[t] = b.try_copy_traceback(&snapshot, t, &mut frames)?;
        }
    }
    b.try_reserve_traces(snapshot.traces.len())?;
    for (i, (tr, domain)) in snapshot
        .traces
        .iter()
        .zip(snapshot.domains.iter())
        .enumerate()
    {
        match &snapshot.blocks {
            Some(blocks) => b.aggregate(domain, tr.size, blocks[i], tb_map[tr.traceback as usize]),
            None => b.trace(domain, tr.size, tb_map[tr.traceback as usize]),
        }
    }
    if snapshot.blocks.is_some() {
        b.aggregates();
    }
    b.metadata(snapshot.metadata);
    b.sample_interval(snapshot.sample_interval);
    b.kinds(snapshot.kinds);
    b.retention(snapshot.retention);
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_compile_while_the_cache_is_held_elsewhere() {
        // As in a forked child whose parent had a thread inside the cache at the fork.
        let held = PATTERN_CACHE.lock();
        let (sent, answer) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sent.send(
                compile_pattern(b"*/held_cache_*.py").map(|p| p.is_match(b"a/held_cache_x.py")),
            );
        });
        let got = answer.recv_timeout(std::time::Duration::from_secs(20));
        drop(held);
        assert!(matches!(got, Ok(Ok(true))), "{got:?}");
    }

    fn glob_match(pattern: &str, name: &str) -> bool {
        let spec = FilterSpec::Filename {
            inclusive: true,
            pattern: pattern.as_bytes().to_vec(),
            lineno: None,
            all_frames: false,
            domain: None,
        };
        FilterSet::new(&[spec])
            .unwrap()
            .keep(0, &[(name.as_bytes(), 0)])
    }

    /// (pattern, filename, what Python's `fnmatch.fnmatch` answers on POSIX).
    const FNMATCH: &[(&str, &str, bool)] = &[
        ("", "", true),
        ("", "abc", false),
        ("abc", "", false),
        ("*", "", true),
        ("*", "a/b/c.py", true),
        ("a*", "abc", true),
        ("a*c", "abb", false),
        ("a*cx", "abcdcx", true),
        ("a*bd*eg", "abcbdefeg", true),
        ("a*bd*eg", "abcbdefef", false),
        ("**", "x/y", true),
        ("a/**/b", "a/b", false),
        ("a/**/b", "a/x/y/b", true),
        ("?", "/", true),
        ("?", "ab", false),
        ("a?c", "abc", true),
        ("a.py", "a.pyc", true),
        ("a.pyc", "a.py", true),
        ("a.py", "a.pyo", false),
        ("ABc", "aBC", false),
        ("a\\b", "a/b", false),
        ("a\\b", "a\\b", true),
        ("a\\*", "a\\xyz", true),
        ("{a,b}", "a", false),
        ("{a,b}", "{a,b}", true),
        ("a^b", "a^b", true),
        ("a$", "a$", true),
        ("(x)|y+", "(x)|y+", true),
        ("[abc]", "b", true),
        ("[abc]", "d", false),
        ("[!abc]", "d", true),
        ("[!abc]", "a", false),
        ("[a-z]x", "qx", true),
        ("[a-z]x", "Qx", false),
        ("[]]", "]", true),
        ("[!]]", "]", false),
        ("[!]]", "a", true),
        ("[]a]", "a", true),
        ("[^a]", "^", true),
        ("[^a]", "b", false),
        ("[^]", "^", true),
        ("[!!]", "!", false),
        ("[!!]", "x", true),
        ("[!]", "[!]", true),
        ("[!]", "!", false),
        ("[", "[", true),
        ("[a", "[a", true),
        ("a]", "a]", true),
        ("[-a]", "-", true),
        ("[a-]", "-", true),
        ("[a-]", "b", false),
        ("[z-a]", "m", false),
        ("[z-a]", "z", false),
        ("[!z-a]", "m", true),
        ("[a-c-e]", "-", true),
        ("[a-c-e]", "d", false),
        ("[a-c-e]", "e", true),
        ("[\\]", "\\", true),
        ("[!-]", "-", false),
        ("[!-]", "a", true),
        ("[]-a]", "^", true),
        ("[]-a]", "-", false),
        ("[!-]x", "ax", true),
        ("[[]", "[", true),
        ("[{]", "{", true),
        ("[,]", ",", true),
        ("[*]", "x", false),
        ("[*]", "*", true),
        ("[?]", "?", true),
        ("é*", "été", true),
        ("?t?", "été", true),
        ("[!é]", "e", true),
        ("[é]", "é", true),
        ("[é]", "e", false),
        ("[a-é]", "b", true),
        ("[!a-é]", "ü", true),
        ("a*", "a\nb", true),
        ("?", "\n", true),
        ("a?c", "a\u{1F600}c", true),
        ("*.py", "\u{e9}t\u{e9}.py", true),
    ];

    #[test]
    fn fnmatch_table() {
        for &(pattern, name, expected) in FNMATCH {
            assert_eq!(
                glob_match(pattern, name),
                expected,
                "pattern {pattern:?} filename {name:?} glob {:?}",
                fnmatch_to_glob(pattern.as_bytes())
            );
        }
    }

    fn snapshot() -> Snapshot {
        let mut b = SnapshotBuilder::new(2);
        let a = b.filename(b"a.py");
        let bb = b.filename(b"b.py");
        let u = b.filename(b"<unknown>");
        let (a2, a5, b4, b1, u0) = (
            b.frame(a, 2),
            b.frame(a, 5),
            b.frame(bb, 4),
            b.frame(bb, 1),
            b.frame(u, 0),
        );
        let t1 = b.traceback(&[a2, b4], Some(3));
        let t2 = b.traceback(&[a5, b4], Some(3));
        let t3 = b.traceback(&[b1], Some(1));
        let t4 = b.traceback(&[u0], Some(1));
        for _ in 0..3 {
            b.trace(0, 10, t1);
        }
        b.trace(1, 2, t2);
        b.trace(2, 66, t3);
        b.trace(3, 7, t4);
        b.finish()
    }

    fn spec(
        inclusive: bool,
        pattern: &str,
        lineno: Option<u32>,
        all: bool,
        domain: Option<u32>,
    ) -> FilterSpec {
        FilterSpec::Filename {
            inclusive,
            pattern: pattern.as_bytes().to_vec(),
            lineno,
            all_frames: all,
            domain,
        }
    }

    #[test]
    fn filter_semantics_table() {
        let s = snapshot();
        // (filters, sizes of the kept traces in order)
        let cases: Vec<(Vec<FilterSpec>, Vec<u64>)> = vec![
            (vec![], vec![10, 10, 10, 2, 66, 7]),
            (
                vec![spec(false, "b.py", None, false, None)],
                vec![10, 10, 10, 2, 7],
            ),
            (
                vec![
                    spec(true, "a.py", Some(2), false, None),
                    spec(true, "a.py", Some(5), false, None),
                ],
                vec![10, 10, 10, 2],
            ),
            (
                vec![spec(false, "a.py", None, false, Some(1))],
                vec![10, 10, 10, 66, 7],
            ),
            (vec![spec(true, "a.py", None, false, Some(1))], vec![2]),
            (
                vec![FilterSpec::Domain {
                    inclusive: false,
                    domain: 3,
                }],
                vec![10, 10, 10, 2, 66],
            ),
            (
                vec![FilterSpec::Domain {
                    inclusive: true,
                    domain: 3,
                }],
                vec![7],
            ),
            (
                vec![spec(true, "b.py", None, true, None)],
                vec![10, 10, 10, 2, 66],
            ),
            (vec![spec(false, "b.py", None, true, None)], vec![7]),
            (
                vec![
                    spec(true, "*.py", None, false, None),
                    spec(false, "a.py", Some(5), false, None),
                ],
                vec![10, 10, 10, 66],
            ),
            (vec![spec(true, "nothing", None, false, None)], vec![]),
        ];
        for (filters, expected) in cases {
            let set = FilterSet::new(&filters).unwrap();
            let out = filter_snapshot(&s, &set).unwrap();
            let sizes: Vec<u64> = out.traces.iter().map(|t| t.size).collect();
            assert_eq!(sizes, expected, "{filters:?}");
            // keep() must agree with the snapshot path.
            let direct: Vec<u64> = s
                .traces
                .iter()
                .zip(s.domains.iter())
                .filter(|(tr, domain)| {
                    let frames: Vec<(&[u8], u32)> = s.tracebacks[tr.traceback as usize]
                        .frames
                        .iter()
                        .map(|&f| (s.frame_filename(f), s.frames[f as usize].lineno))
                        .collect();
                    set.keep(*domain, &frames)
                })
                .map(|(t, _)| t.size)
                .collect();
            // The domains of the traces kept stay with them.
            assert_eq!(out.domains.len(), out.traces.len());
            assert_eq!(direct, expected, "{filters:?}");
        }
    }

    #[test]
    fn compaction_drops_unused_tables() {
        let s = snapshot();
        let set = FilterSet::new(&[FilterSpec::Domain {
            inclusive: true,
            domain: 3,
        }])
        .unwrap();
        let out = filter_snapshot(&s, &set).unwrap();
        assert_eq!(out.tracebacks.len(), 1);
        assert_eq!(
            out.filenames,
            vec![b"<unknown>".to_vec().into_boxed_slice()]
        );
    }

    /// Reports stay for the sites a kept trace was allocated at (its most recent frame):
    /// not for a site only an older frame of a kept trace shows, nor for filtered-out ones.
    #[test]
    fn filters_keep_the_reports_of_kept_sites() {
        let report = |filename: &str, lineno| SiteRetention {
            filename: filename.as_bytes().into(),
            lineno,
            count: 1,
            ..SiteRetention::default()
        };
        let mut s = snapshot();
        s.retention = Some(vec![
            report("a.py", 2),
            report("a.py", 5),
            report("b.py", 4),
            report("b.py", 1),
            report("c.py", 9),
        ]);
        let sites = |out: &Snapshot| -> Vec<(String, u32)> {
            out.retention
                .as_ref()
                .unwrap()
                .iter()
                .map(|r| (String::from_utf8(r.filename.to_vec()).unwrap(), r.lineno))
                .collect()
        };
        let cases: &[(FilterSpec, &[(&str, u32)])] = &[
            (spec(true, "a.py", Some(2), false, None), &[("a.py", 2)]),
            (spec(false, "a.py", None, false, None), &[("b.py", 1)]),
            (
                spec(true, "b.py", None, true, None),
                &[("a.py", 2), ("a.py", 5), ("b.py", 1)],
            ),
            (spec(true, "nothing", None, false, None), &[]),
        ];
        for (f, want) in cases {
            let out =
                filter_snapshot(&s, &FilterSet::new(std::slice::from_ref(f)).unwrap()).unwrap();
            let want: Vec<(String, u32)> = want.iter().map(|&(f, l)| (f.into(), l)).collect();
            assert_eq!(sites(&out), want, "{f:?}");
        }
        let plain = filter_snapshot(&snapshot(), &FilterSet::new(&[]).unwrap()).unwrap();
        assert_eq!(plain.retention, None);
        // Compaction keeps what the filter chose.
        assert_eq!(compact(s.clone()).unwrap().retention, s.retention);
    }

    #[test]
    fn surrogatepass_validation() {
        assert!(is_surrogatepass_utf8(b"abc"));
        assert!(is_surrogatepass_utf8(b"a\xed\xb3\xbf"));
        assert!(!is_surrogatepass_utf8(b"a\xff"));
        assert!(!is_surrogatepass_utf8(b"\xc0\x80"));
        assert!(!is_surrogatepass_utf8(b"\xe2\x82"));
    }
}
