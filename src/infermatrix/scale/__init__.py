"""Spreading the matrix over machines: `export` writes a CI matrix (one job per cell group)
and `merge` joins the journals and images.lock fragments those jobs bring back."""
