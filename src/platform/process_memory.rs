//! The process's resident memory as the kernel reports it, to set the traced total against.
//!
//! Traced bytes and RSS measure different things: traced bytes are what the program asked the
//! allocators for and still holds; RSS is the pages mapped into the process and present in
//! RAM, whoever mapped them (allocator caches and fragmentation, pymalloc's arenas, the
//! interpreter's and libraries' code, untraced `mmap`s). Reporting both, split the way the
//! kernel splits them, lets a user see which part of the gap is which.
//!
//! Source: `/proc/self/status` (Linux), whose `VmRSS` is exactly `RssAnon + RssFile +
//! RssShmem`, and whose `VmHWM` is the peak RSS. All in kB there, bytes here.

use serde::{Deserialize, Serialize};

/// Resident memory in bytes, at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMemory {
    /// `VmRSS`: every resident page.
    pub rss: u64,
    /// `RssAnon`: anonymous pages (heaps, arenas, anonymous `mmap`s, stacks).
    pub anon: u64,
    /// `RssFile`: pages of mapped files (executable, libraries, file `mmap`s).
    pub file: u64,
    /// `RssShmem`: shared memory (System V, POSIX shm, shared anonymous mappings, tmpfs).
    pub shmem: u64,
    /// `VmHWM`: the peak RSS of the process so far.
    pub peak_rss: u64,
}

impl ProcessMemory {
    /// Parses the text of `/proc/<pid>/status`. The error names the field that is missing or
    /// unreadable.
    pub fn parse_status(text: &str) -> Result<Self, String> {
        let field = |name: &str| -> Result<u64, String> {
            let line = text
                .lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .ok_or_else(|| format!("/proc/self/status has no {name} line"))?;
            let kb = line
                .trim()
                .strip_suffix("kB")
                .map(str::trim)
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| {
                    format!("/proc/self/status: {name} is not a size in kB: {line:?}")
                })?;
            kb.checked_mul(1024)
                .ok_or_else(|| format!("/proc/self/status: {name} is out of range"))
        };
        Ok(Self {
            rss: field("VmRSS")?,
            anon: field("RssAnon")?,
            file: field("RssFile")?,
            shmem: field("RssShmem")?,
            peak_rss: field("VmHWM")?,
        })
    }

    /// The calling process's figures now.
    pub fn current() -> Result<Self, String> {
        let text = std::fs::read_to_string("/proc/self/status")
            .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
        Self::parse_status(&text)
    }

    /// Why these figures cannot have come from the kernel, if they cannot: the three parts
    /// add up to more than the RSS. (Loaded files are checked with this.)
    pub fn inconsistency(&self) -> Option<String> {
        let parts = self
            .anon
            .checked_add(self.file)
            .and_then(|s| s.checked_add(self.shmem));
        match parts {
            Some(sum) if sum <= self.rss => None,
            _ => Some(format!(
                "anonymous {} + file-backed {} + shared {} bytes exceed the RSS of {} bytes",
                self.anon, self.file, self.shmem, self.rss
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tpython3\nVmPeak:\t  30000 kB\nVmHWM:\t   12000 kB\n\
        VmRSS:\t   11000 kB\nRssAnon:\t    6000 kB\nRssFile:\t    4900 kB\n\
        RssShmem:\t     100 kB\nThreads:\t1\n";

    #[test]
    fn parses_the_kernel_fields_in_bytes() {
        assert_eq!(
            ProcessMemory::parse_status(STATUS).unwrap(),
            ProcessMemory {
                rss: 11000 * 1024,
                anon: 6000 * 1024,
                file: 4900 * 1024,
                shmem: 100 * 1024,
                peak_rss: 12000 * 1024,
            }
        );
    }

    #[test]
    fn bad_status_text_names_the_field() {
        // (text, expected fragment of the error)
        let cases = [
            (STATUS.replace("VmRSS", "VmXXX"), "no VmRSS line"),
            (
                STATUS.replace("6000 kB", "6000 MB"),
                "RssAnon is not a size",
            ),
            (STATUS.replace("4900", "-1"), "RssFile is not a size"),
            (
                STATUS.replace("100 kB", "99999999999999999999 kB"),
                "RssShmem is not",
            ),
            (
                STATUS.replace("12000", "18446744073709551615"),
                "VmHWM is out of range",
            ),
            (String::new(), "no VmRSS line"),
        ];
        for (text, expected) in cases {
            let err = ProcessMemory::parse_status(&text).unwrap_err();
            assert!(err.contains(expected), "{expected:?} not in {err:?}");
        }
    }

    #[test]
    fn current_figures_are_consistent() {
        let now = ProcessMemory::current().unwrap();
        assert!(now.rss > 0 && now.peak_rss >= now.rss);
        assert_eq!(now.inconsistency(), None);
        let bad = ProcessMemory {
            anon: now.rss + 1,
            ..now
        };
        assert!(bad.inconsistency().unwrap().contains("exceed the RSS"));
        let overflow = ProcessMemory {
            anon: u64::MAX,
            file: 1,
            ..now
        };
        assert!(overflow.inconsistency().is_some());
    }
}
