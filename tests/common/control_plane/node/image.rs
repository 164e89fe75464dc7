//! The node's images, made here (there is no registry): one layer holding Debian's static busybox
//! and links to the applets the tests run, written as a `docker save` archive, which
//! `ctr images import` takes.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The applets linked to `/bin/busybox` in the layer.
const APPLETS: &[&str] = &["sh", "sleep", "echo", "cat"];

/// Writes `NAME.tar`, a `docker save` archive of image `reference` whose entrypoint is
/// `entrypoint`, into `dir`, and returns its path.
pub fn write_archive(
    dir: &Path,
    name: &str,
    reference: &str,
    entrypoint: &[&str],
) -> Result<PathBuf, String> {
    let work = dir.join(name);
    let rootfs = work.join("rootfs");
    let bin = rootfs.join("bin");
    std::fs::create_dir_all(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(Path::new)
        .find(|path| path.is_file())
        .ok_or("busybox is not installed: run scripts/setup (it installs busybox-static)")?;
    std::fs::copy(busybox, bin.join("busybox"))
        .map_err(|e| format!("copy {}: {e}", busybox.display()))?;
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", bin.join(applet))
            .map_err(|e| format!("link /bin/{applet}: {e}"))?;
    }
    let archive = work.join("archive");
    std::fs::create_dir_all(&archive).map_err(|e| format!("{}: {e}", archive.display()))?;
    let layer = archive.join("layer.tar");
    run(Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-C",
        ])
        .arg(&rootfs)
        .arg("-cf")
        .arg(&layer)
        .arg("."))?;
    let layer_digest = sha256(&layer)?;
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    });
    let config_path = archive.join("config.json");
    std::fs::write(&config_path, config.to_string())
        .map_err(|e| format!("{}: {e}", config_path.display()))?;
    let manifest = serde_json::json!([{
        "Config": "config.json",
        "RepoTags": [reference],
        "Layers": ["layer.tar"],
    }]);
    std::fs::write(archive.join("manifest.json"), manifest.to_string())
        .map_err(|e| format!("manifest.json: {e}"))?;
    let tar = dir.join(format!("{name}.tar"));
    run(Command::new("tar")
        .arg("-C")
        .arg(&archive)
        .arg("-cf")
        .arg(&tar)
        .args(["manifest.json", "config.json", "layer.tar"]))?;
    Ok(tar)
}

/// The hex SHA-256 of `path`, by coreutils' `sha256sum`.
fn sha256(path: &Path) -> Result<String, String> {
    let output = run(Command::new("sha256sum").arg(path))?;
    output
        .split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("sha256sum {} printed nothing", path.display()))
}

/// Runs `command`; its stdout, or an error with its stderr.
pub fn run(command: &mut Command) -> Result<String, String> {
    let output = command
        .output()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
