"""The target Secret: what it should hold (render, managed keys), and writing it safely."""
