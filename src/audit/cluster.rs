//! STUB: replaced by the cluster helper (live cluster listing, symptoms, PolicyReports).
