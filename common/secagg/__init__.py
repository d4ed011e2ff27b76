"""Secure aggregation (SecAgg+) as a pure library: the server learns only the sum of the survivors'
integer vectors mod 2^b (issue 34). One concern per module: ``prf`` (masks from HKDF + ChaCha20),
``graph`` (the public neighbour graph), ``keys`` (ECDH and authenticated encryption of shares),
``shamir`` (threshold sharing), ``protocol`` (the stages, client and server)."""
