"""The method: the coupling metric, spectra, token-diagonal attention, the architecture
adapter table, block functions and block Jacobians. Knows no notebook, no storage, no book.

Shapes: public functions name tensors plainly (``J``, ``Js``, ``X``, ``S``, ``V``) and give
their shapes in the docstring as ``J: Tensor  # [T, d_out, d_in]``, with these dimension names:
``T`` tokens, ``d`` the model's width (``d_out``, ``d_in``: a Jacobian's rows and columns; ``m``,
``n`` for any matrix), ``N`` Jacobians in a stack, ``K`` top singular vectors, ``r`` a rank,
``l`` probe vectors, ``L`` blocks, ``B`` batch, ``H`` heads, ``S`` keys, ``e`` head width; ``...``
any leading (batch) dimensions.
"""
