//! STUB: replaced by the report helper (table, JSON, SARIF, patch renderers).
