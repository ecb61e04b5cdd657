//! mako-tests
