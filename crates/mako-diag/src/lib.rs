//! mako-diag
