"""The conformance matrix: features combined at random, every promise checked on each cell.

Read in this order: ``cells`` (the axes, a cell drawn from a seed), ``data`` (the files a cell
reads, whose records say who they are), ``pipeline`` (the chain of stages), ``run`` (the loaders,
driven as a training loop drives them), ``checks`` (the invariants), ``matrix`` (one cell end to
end) and ``test_matrix`` (the fixed sample and the named cases). See docs/conformance.md.
"""
