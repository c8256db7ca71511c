"""Encoded image bytes: headers, decoding on the CPU and GPU, and the JPEG tricks behind both.

One place for everything that knows how images are encoded:

* :mod:`~shardkit.codec.jpeg_header` reads a JPEG's frame header (size, coding process,
  components) without decoding;
* :mod:`~shardkit.codec.decode` decodes any image to uint8 RGB on the CPU (libjpeg-turbo through
  torchvision or TorchCodec, PIL for the rest);
* :mod:`~shardkit.codec.backend` chooses torchvision or TorchCodec, for the CPU and the GPU (the
  one place; :func:`~shardkit.codec.backend.prefer_decoder` overrides);
* :mod:`~shardkit.codec.libjpeg` decodes whole JPEGs with the same C extension, returning
  libjpeg's warnings about corrupt data instead of printing them (``decode`` tries it first);
* :mod:`~shardkit.codec.jpeg_region` decodes only a crop box of a JPEG (C extension);
* :mod:`~shardkit.codec.jpeg_restart` writes restart-indexed JPEGs and cuts a box's restart
  intervals out of them without decoding (C extension; used by ``pack --jpeg-restart``);
* :mod:`~shardkit.codec.nvjpeg` decodes batches on a CUDA device (nvJPEG) and says which files it
  takes.

Nothing here imports torch at package import; the modules that need it import it themselves.
"""
