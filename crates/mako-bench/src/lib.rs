//! mako-bench
