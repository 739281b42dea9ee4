"""Softmax attention around the linear layers of a hybrid: the decode token's q/k preparation."""
