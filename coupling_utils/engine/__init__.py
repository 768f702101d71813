"""The method: the coupling metric, spectra, token-diagonal attention, the architecture
adapter table, block functions and block Jacobians. Knows no notebook, no storage, no book."""
