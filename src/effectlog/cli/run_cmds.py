def register(sub): pass
