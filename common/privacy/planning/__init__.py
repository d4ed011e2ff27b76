"""A run's noise plan: NoisePlan and what each noise family owns of it (the Gaussian release's, secure aggregation's Skellam numbers, correlated noise's banded factorization)."""
