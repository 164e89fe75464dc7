//! Paths in a container's filesystem: the mount that holds a path and where that is in its
//! volume (`/var/run` and `/run` taken as one), and the comparisons of mount paths. Knows
//! nothing of Docker; [`super::placement`] and [`super::injection`] ask it.

use k8s_openapi::api::core::v1::{Container, VolumeMount};

/// Where a path of a container is: the mount holding it, the path as that mount resolves it,
/// and its place in the volume.
pub(super) struct Located<'a> {
    pub mount: &'a VolumeMount,
    pub path: String,
    pub location: (String, String),
}

/// The container's mount holding `path` (the deepest one). `/var/run` links to `/run` in most
/// images, so a path under one is also looked for under the other.
pub(super) fn locate<'a>(container: &'a Container, path: &str) -> Option<Located<'a>> {
    let path = path.trim_end_matches('/');
    let aliased = if let Some(rest) = path.strip_prefix("/var/run/") {
        Some(format!("/run/{rest}"))
    } else {
        path.strip_prefix("/run/")
            .map(|rest| format!("/var/run/{rest}"))
    };
    std::iter::once(path.to_string())
        .chain(aliased)
        .find_map(|path| {
            let mount = mount_holding(container, &path)?;
            let rest = path[mount.mount_path.trim_end_matches('/').len()..].trim_start_matches('/');
            let within = match mount.sub_path.as_deref().or(mount.sub_path_expr.as_deref()) {
                Some(sub) if !sub.is_empty() && !rest.is_empty() => format!("{sub}/{rest}"),
                Some(sub) if !sub.is_empty() => sub.to_string(),
                _ => rest.to_string(),
            };
            Some(Located {
                mount,
                location: (mount.name.clone(), within),
                path,
            })
        })
}

/// The container's mount whose path holds `path` (the deepest one).
fn mount_holding<'a>(container: &'a Container, path: &str) -> Option<&'a VolumeMount> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| holds(&m.mount_path, path))
        .max_by_key(|m| depth(&m.mount_path))
}

/// Whether `dir` is `path` or one of its parents.
pub(super) fn holds(dir: &str, path: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    let path = path.trim_end_matches('/');
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

pub(super) fn same_path(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

pub(super) fn depth(path: &str) -> usize {
    path.split('/').filter(|part| !part.is_empty()).count()
}

/// The container's mount at `path` itself.
pub(super) fn mount_at<'a>(container: &'a Container, path: &str) -> Option<&'a VolumeMount> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| same_path(&m.mount_path, path))
}
