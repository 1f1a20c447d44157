import nestor

config = nestor.get_config()
for step in range(20):
    nestor.report({"loss": (config["lr"] - 0.01) ** 2 + 1 / (step + 1)})
