import os
from fourcard_helpers import report

names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
report(**{name: os.environ[name] for name in names})
print({name: os.environ[name] for name in names[:4]})
