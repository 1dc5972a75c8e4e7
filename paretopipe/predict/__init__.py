"""Prediction: device profiles (read torch-free, measured by :mod:`.measure`), the cost model, the
N-device planner, predictions per split and their validation against a measured sweep."""
