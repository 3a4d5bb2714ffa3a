"""`tilefuse train digits [--epochs N] [--out DIR]`: registered by the main cli."""
from __future__ import annotations

import argparse


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("train", help="train a network with fused BN/ReLU/Add (issue 5)",
                              description="Train a small residual network with batch norm on the "
                                          "8x8 digits data set shipped with tilefuse.")
    p.add_argument("dataset", choices=["digits"], help="data set (shipped inside the package)")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--schedule", choices=["fused", "unfused"], default="fused")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="directory for the weights (.npz) and the plot (.png)")
    p.add_argument("--traffic", action="store_true", help="print the traffic report of the last step")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from .digits import train_digits

    if args.epochs < 1 or args.batch < 2:
        print(f"error: --epochs {args.epochs} and --batch {args.batch}; expected >= 1 and >= 2")
        return 2
    r = train_digits(epochs=args.epochs, batch=args.batch, lr=args.lr, schedule=args.schedule,
                     out=args.out, seed=args.seed, progress=not args.no_progress)
    print(f"digits: test accuracy {r['test_accuracy'] * 100:.2f}% after {args.epochs} epochs "
          f"in {r['seconds']:.1f} s ({args.schedule} schedule)")
    if r["plot"]:
        print(f"plot: {r['plot']}")
    if args.traffic:
        r["trainer"].traffic_report()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tilefuse")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
