"""jaxmarket: a JAX simulator of query markets."""
