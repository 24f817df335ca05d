"""`microtrain train --plot curves.png`: loss and accuracy per epoch, drawn with matplotlib
(the optional extra `plot`: pip install 'microtrain[plot]')."""
from ..errors import MicrotrainHostError


class PlotError(MicrotrainHostError):
    """matplotlib missing, or the picture cannot be written."""


def require_matplotlib():
    """Fail before training, not after it, when the extra is not installed."""
    try:
        import matplotlib
    except ImportError as e:
        raise PlotError("--plot needs matplotlib: pip install 'microtrain[plot]'") from e
    matplotlib.use("Agg")    # no display needed


def plot_curves(records, path, title="microtrain train"):
    """records: (epoch, train loss, val loss or None, val accuracy or None) per epoch."""
    require_matplotlib()
    import matplotlib.pyplot as plt
    epochs = [r[0] for r in records]
    fig, loss_axis = plt.subplots(figsize=(7, 4), dpi=100)
    try:
        loss_axis.plot(epochs, [r[1] for r in records], "o-", color="tab:blue", label="train loss")
        if all(r[2] is not None for r in records):
            loss_axis.plot(epochs, [r[2] for r in records], "s--", color="tab:cyan",
                           label="validation loss")
        loss_axis.set_xlabel("epoch")
        loss_axis.set_ylabel("loss")
        loss_axis.set_ylim(bottom=0)
        loss_axis.set_xticks(epochs)
        handles, labels = loss_axis.get_legend_handles_labels()
        if all(r[3] is not None for r in records):
            acc_axis = loss_axis.twinx()
            acc_axis.plot(epochs, [100 * r[3] for r in records], "^-", color="tab:orange",
                          label="validation accuracy")
            acc_axis.set_ylabel("accuracy (%)")
            acc_axis.set_ylim(0, 100)
            more = acc_axis.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
        loss_axis.legend(handles, labels, loc="center right")
        loss_axis.set_title(title)
        loss_axis.grid(alpha=0.3)
        fig.tight_layout()
        try:
            fig.savefig(path, format="png")
        except OSError as e:
            raise PlotError(f"cannot write the plot '{path}': {e}") from e
    finally:
        plt.close(fig)
