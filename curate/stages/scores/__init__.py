"""Quality scores as columns: heuristic composite, reference classifier, DSIR weights, curriculum difficulty.

``tokens.py`` and ``features.py`` hold the hashed word n-gram featurizer the three model-based
scores share; ``linear.py`` the classifier's model. Scores remove rows only when a ``min_*``
threshold is set.
"""
