"""Ray's experiment-tracking integrations (``ray.air.integrations``)."""
