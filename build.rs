//! Build script: enables pyo3's `Py_3_*` cfgs and derives the interpreter's private struct
//! offsets from its own headers.
//!
//! The stack walker reads CPython's frame structures directly, and their layouts change
//! between minor versions. Rather than hard-coding offsets we compile `src/capture/layout.c`
//! against the target interpreter's headers (internal ones included), run it, and write what
//! it prints to `$OUT_DIR/layout.rs`. A build for a given interpreter therefore cannot use
//! another interpreter's offsets.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    pyo3_build_config::use_pyo3_cfgs();
    println!("cargo:rerun-if-changed=src/capture/layout.c");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");

    let config = pyo3_build_config::get();
    let python = config
        .executable()
        .map(str::to_owned)
        .expect("pyo3 did not report a Python executable; set PYO3_PYTHON");
    let include = run(Command::new(&python)
        .arg("-c")
        .arg("import sysconfig; print(sysconfig.get_path('include'))"));
    let include = include.trim();

    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let exe = out_dir.join("alloctrace_layout");
    let compiler = cc::Build::new().cargo_metadata(false).get_compiler();
    let status = compiler
        .to_command()
        .arg(format!("-I{include}"))
        .arg("src/capture/layout.c")
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("cannot run the C compiler to derive CPython struct offsets");
    assert!(
        status.success(),
        "compiling src/capture/layout.c against {include} failed"
    );
    let layout = run(&mut Command::new(&exe));
    std::fs::write(out_dir.join("layout.rs"), layout).unwrap();
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
