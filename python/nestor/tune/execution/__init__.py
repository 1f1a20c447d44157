"""Ray's ``ray.tune.execution`` paths that scripts import from."""
