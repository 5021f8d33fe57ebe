//! The command-line tests: the real `gerbilc` and `gerbil-run` binaries,
//! driven as a user or a script drives them. One test binary (each module
//! was one before): a binary per file linked the whole workspace again for
//! each, which cost more than most of them run. Tests that use the GPU hold
//! [`common::GPU`] (lavapipe already uses every core); the rest run beside
//! them.

mod binaries;
mod common;
mod devices;
mod embed;
mod files;
mod generation;
mod gpu_faults;
mod hardening_sizes;
mod hardening_values;
mod hub;
mod selftest;
mod serve;
mod slots;
mod structured;
mod svg;
mod train;
mod web;
