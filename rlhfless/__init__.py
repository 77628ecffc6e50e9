"""rlhfless: serverless synchronous RL post-training."""
__version__ = "0.1.0"
