//! The machine a snapshot is taken on, so that a reader can tell whether the file names in it
//! name files of its own machine (the commands show source lines only then; see
//! `python/alloctrace/_source.py`).
//!
//! The id is derived from `/etc/machine-id` (or D-Bus's copy; in a container image without
//! either, from the boot id and the container's hostname) the way systemd asks ids to be
//! shown to the outside: never the raw id, but a hash of it under an application-specific key
//! (`sd_id128_get_machine_app_specific` does the same with HMAC). Here: SHA-256 over a fixed
//! prefix and the raw id, first 128 bits in hex. It is stable across reboots, equal for every
//! process of one machine (containers that share the host's file see the host's id), and tells
//! nothing about the raw id. It is a fidelity guard, not an authentication: a file can claim any
//! id. The hostname rides along for display only.

use sha2::{Digest, Sha256};
use std::sync::OnceLock;

/// Where a snapshot was taken: the app-specific machine id (32 lowercase hex digits) and the
/// hostname when it was taken.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Machine {
    pub id: String,
    pub hostname: String,
}

/// The longest id and hostname a snapshot file may hold (a hostname is at most 64 bytes on
/// Linux; ids written by this build are 32).
pub const MAX_ID_LEN: usize = 64;
pub const MAX_HOSTNAME_LEN: usize = 255;

const KEY: &[u8] = b"alloctrace machine id v1\0";
const ID_FILES: [&str; 2] = ["/etc/machine-id", "/var/lib/dbus/machine-id"];

/// The app-specific id of a raw machine id (its text, whitespace trimmed); `None` for an empty
/// or implausible one (systemd's "uninitialized" placeholder included).
pub fn app_specific_id(raw: &str) -> Option<String> {
    let raw = raw.trim();
    if raw.len() < 16 || raw.len() > 128 || raw == "uninitialized" {
        return None;
    }
    let digest = Sha256::new()
        .chain_update(KEY)
        .chain_update(raw.as_bytes())
        .finalize();
    Some(digest[..16].iter().map(|b| format!("{b:02x}")).collect())
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or
    // truncates, and the last byte is kept 0.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The kernel's id of the current boot: where no machine id exists (many container images
/// ship without `/etc/machine-id`), the boot id and the hostname (a container's own) stand in
/// for it. Such an id changes at each reboot: a snapshot read after one shows no source lines
/// unless the user names where they are.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The stand-in raw id from a boot id and a hostname; `None` for an implausible boot id.
fn boot_raw_id(boot_id: &str, hostname: &str) -> Option<String> {
    let boot_id = boot_id.trim();
    (boot_id.len() >= 16).then(|| format!("boot:{boot_id}:{hostname}"))
}

/// This machine, read once per process: from its machine id, or else from its boot id and
/// hostname; `None` where neither can be read (then snapshots record no machine, and a reader
/// treats them as from elsewhere).
pub fn current() -> Option<Machine> {
    static CURRENT: OnceLock<Option<Machine>> = OnceLock::new();
    CURRENT
        .get_or_init(|| {
            let hostname = hostname();
            let id = ID_FILES
                .iter()
                .find_map(|path| app_specific_id(&std::fs::read_to_string(path).ok()?))
                .or_else(|| {
                    let boot = std::fs::read_to_string(BOOT_ID).ok()?;
                    app_specific_id(&boot_raw_id(&boot, &hostname)?)
                })?;
            Some(Machine { id, hostname })
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_hashed_stable_and_do_not_contain_the_raw_id() {
        let raw = "3d1219c7c4c5404aaa1f6d2a48adfda4";
        let id = app_specific_id(raw).unwrap();
        assert_eq!(id.len(), 32);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(app_specific_id(&format!("{raw}\n")).unwrap(), id);
        assert!(!id.contains(&raw[..8]));
        assert_ne!(
            app_specific_id("3d1219c7c4c5404aaa1f6d2a48adfda5").unwrap(),
            id
        );
        for bad in ["", "\n", "uninitialized", "short"] {
            assert_eq!(app_specific_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn without_a_machine_id_the_boot_id_and_hostname_stand_in() {
        let boot = "6a1e9b8c-9d9b-4c2f-8f0e-0c3f2a1b7d45\n";
        let id = app_specific_id(&boot_raw_id(boot, "c0ffee").unwrap()).unwrap();
        assert_eq!(id.len(), 32);
        // Another container on the same boot, or the same one after a reboot: another id.
        assert_ne!(
            app_specific_id(&boot_raw_id(boot, "beef").unwrap()).unwrap(),
            id
        );
        let rebooted = "7b2f0c9d-0e0c-4d3f-9f1f-1d4f3b2c8e56";
        assert_ne!(
            app_specific_id(&boot_raw_id(rebooted, "c0ffee").unwrap()).unwrap(),
            id
        );
        assert_eq!(boot_raw_id("", "c0ffee"), None);
    }

    #[test]
    fn the_current_machine_is_read_once_and_bounded() {
        if let Some(m) = current() {
            assert!(m.id.len() <= MAX_ID_LEN && m.hostname.len() <= MAX_HOSTNAME_LEN);
            assert_eq!(current(), Some(m));
        }
    }
}
