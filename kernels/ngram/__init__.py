"""Prompt lookup for speculative decoding: draft tokens found earlier in the sequence itself."""
