"""Ray's ``ray.tune.integration`` paths."""
