"""Sample-level privacy audits: canary examples in the real local training (``fedlora audit mia``),
and the node half of ``fedlora audit client``'s canary clients."""
