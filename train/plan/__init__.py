"""``winnow plan``: from a budget to a model size, a token count and a parallel layout.

``hardware`` holds the small table of common accelerators and links, ``shape`` turns an active
parameter target into a concrete ``[train.model]``, ``layout`` picks dp/tp/pp/ep degrees from
memory and interconnect, and ``report`` formats the answer (never "0.00 h").
"""
