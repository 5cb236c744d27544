"""Datasets with declared bounds, local privatization and sampling."""

from lightning_dpot.data.central import CentralDPDataModule
from lightning_dpot.data.denoise import WaveletDenoising, wavelet_denoise
from lightning_dpot.data.image_files import CelebA, ImageFolder
from lightning_dpot.data.images import MNIST, FashionMNIST
from lightning_dpot.data.latent import PrivateLatentDataModule
from lightning_dpot.data.ledger_settings import LedgerSettings
from lightning_dpot.data.manifolds import Ellipse, GaussianMixture2D, HalfCircle, Rectangle
from lightning_dpot.data.privatized import PrivatizedDataModule
from lightning_dpot.data.public_split import PublicSplitDataModule
from lightning_dpot.data.release import Release
from lightning_dpot.data.sources import DataSource, DataSplits
from lightning_dpot.data.table import Table
from lightning_dpot.data.tabular import Digits, TensorFile

__all__ = [
    "MNIST",
    "CelebA",
    "CentralDPDataModule",
    "FashionMNIST",
    "ImageFolder",
    "WaveletDenoising",
    "wavelet_denoise",
    "DataSource",
    "DataSplits",
    "Digits",
    "Ellipse",
    "GaussianMixture2D",
    "HalfCircle",
    "LedgerSettings",
    "PrivateLatentDataModule",
    "PrivatizedDataModule",
    "PublicSplitDataModule",
    "Rectangle",
    "Release",
    "Table",
    "TensorFile",
]
