//! Tool calls in a model's own format.
