"""Getting models: loading from the hub or a local path, the embedded offline zoo, the
training corpus, and the local LM and ViT training runs with their checkpoints."""
