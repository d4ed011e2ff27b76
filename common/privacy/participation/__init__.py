"""Who takes part and who sees what: the participation rules (Poisson sampling, capped cohorts, min-separation) and the threat models (where the noise is added, what each observer sees)."""
