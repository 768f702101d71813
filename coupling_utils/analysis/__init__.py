"""One module per finding (named after its chapter), plus the data with provenance, the
statistics, and the chart builders the notebooks call."""
