"""DR-Encoder, client side: Algorithm 1 statistics of local steps and the codec a round names."""
