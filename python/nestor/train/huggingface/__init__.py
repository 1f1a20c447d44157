"""Ray Train's ``ray.train.huggingface``: Hugging Face Transformers on a
``TorchTrainer`` is in ``nestor.train.huggingface.transformers``."""
