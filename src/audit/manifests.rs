//! STUB: manifests reader (mine).
