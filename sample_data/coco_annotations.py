"""Hand-made annotations of the photos in ``sample_data/photos/`` (pixel coordinates of those
512-px photos), and the images :mod:`sample_data.make_coco` cuts from them.

Each object is a category id plus one or more polygons ``[(x, y), ...]`` outlining it (an
ellipse n-gon for round things); checked by drawing them over the photos. Boxes and areas are
derived from these outlines by ``make_coco``.
"""

from __future__ import annotations

import math
from typing import Any

Poly = list[tuple[float, float]]


def ellipse(cx: float, cy: float, rx: float, ry: float | None = None, n: int = 16) -> Poly:
    """An ellipse (a circle when ``ry`` is None) as an n-gon."""
    ry = rx if ry is None else ry
    return [(round(cx + rx * math.cos(2 * math.pi * k / n), 2),
             round(cy + ry * math.sin(2 * math.pi * k / n), 2))
            for k in range(n)]


#: COCO ids where COCO has the category (person 1, cat 17, cup 47, spoon 50); others from 91 up.
CATEGORIES: list[dict[str, Any]] = [
    {"id": 1, "name": "person", "supercategory": "person"},
    {"id": 17, "name": "cat", "supercategory": "animal"},
    {"id": 47, "name": "cup", "supercategory": "kitchen"},
    {"id": 50, "name": "spoon", "supercategory": "kitchen"},
    {"id": 91, "name": "face", "supercategory": "person"},
    {"id": 92, "name": "eye", "supercategory": "animal"},
    {"id": 93, "name": "nose", "supercategory": "animal"},
    {"id": 94, "name": "coin", "supercategory": "object"},
    {"id": 95, "name": "saucer", "supercategory": "kitchen"},
    {"id": 96, "name": "rocket", "supercategory": "vehicle"},
    {"id": 97, "name": "helmet", "supercategory": "object"},
    {"id": 98, "name": "spacecraft model", "supercategory": "object"},
    {"id": 99, "name": "flag", "supercategory": "object"},
    {"id": 100, "name": "camera", "supercategory": "object"},
    {"id": 101, "name": "tripod", "supercategory": "object"},
]

#: photo -> file name of its full-size image (one in a sub-folder, one non-ASCII NFC name).
PHOTOS: dict[str, str] = {
    "astronaut": "astronaut.jpg",
    "chelsea": "chelsea.jpg",
    "coffee": "café_crème.jpg",
    "rocket": "space/rocket.jpg",
    "coins": "coins.jpg",
    "camera": "camera.jpg",
    "brick": "brick.jpg",  # nothing to annotate: an image without annotations
    "hubble": "space/hubble.jpg",  # ditto
}

_COINS_TOP = [(45, 50, 22), (100, 55, 20), (155, 47, 24), (215, 50, 24), (275, 52, 22),
              (335, 50, 30), (45, 125, 22), (105, 125, 20), (155, 127, 20), (205, 125, 22),
              (270, 120, 26), (335, 122, 20), (40, 190, 20), (100, 190, 22), (155, 190, 20),
              (210, 187, 24), (272, 190, 24), (345, 188, 33)]
_COINS_BOTTOM = [(45, 258, 27), (115, 262, 22), (170, 258, 27), (240, 262, 24), (300, 262, 24),
                 (355, 265, 23)]

OBJECTS: dict[str, list[dict[str, Any]]] = {
    "astronaut": [
        {"category_id": 1, "polygons": [[(225, 14), (265, 20), (295, 45), (300, 100), (290, 150),
                                         (300, 190), (305, 240), (335, 290), (355, 310), (365, 345),
                                         (290, 400), (275, 512), (22, 512), (20, 420), (30, 320),
                                         (50, 285), (90, 262), (125, 240), (115, 200), (140, 165),
                                         (165, 150), (155, 100), (160, 45), (185, 22)]]},
        {"category_id": 91, "polygons": [ellipse(220, 112, 48, 62)]},
        {"category_id": 97, "polygons": [ellipse(395, 450, 120, 105, n=24)]},
        {"category_id": 98, "polygons": [[(405, 2), (425, 5), (438, 30), (440, 90), (450, 150),
                                          (455, 215), (470, 260), (470, 285), (362, 285),
                                          (360, 260), (355, 220), (365, 150), (378, 90), (385, 45),
                                          (395, 25)]]},
        {"category_id": 99, "polygons": [[(0, 0), (60, 0), (70, 60), (80, 150), (95, 230),
                                          (80, 290), (40, 320), (0, 330)]]},
    ],
    "chelsea": [
        {"category_id": 17, "polygons": [[(20, 0), (395, 0), (400, 60), (385, 150), (360, 230),
                                          (330, 300), (40, 300), (15, 220), (5, 120), (10, 40)]]},
        {"category_id": 92, "polygons": [ellipse(170, 115, 35, 32)]},
        {"category_id": 92, "polygons": [ellipse(320, 135, 25, 30)]},
        {"category_id": 93,
         "polygons": [[(240, 228), (295, 225), (290, 245), (265, 262), (248, 245)]]},
    ],
    "coffee": [
        {"category_id": 47, "polygons": [[(148, 95), (160, 45), (200, 20), (250, 14), (300, 20),
                                          (340, 40), (352, 90), (345, 150), (335, 185), (305, 205),
                                          (270, 215), (220, 215), (215, 245), (175, 250),
                                          (165, 225), (185, 200), (170, 170), (152, 130)]]},
        {"category_id": 50, "polygons": [[(350, 55), (362, 65), (345, 130), (330, 185), (335, 215),
                                          (345, 240), (330, 270), (300, 278), (280, 262),
                                          (278, 235), (295, 210), (318, 195), (330, 140),
                                          (345, 70)]]},
        {"category_id": 95, "polygons": [ellipse(238, 200, 172, 135, n=32)]},
    ],
    "rocket": [
        {"category_id": 96, "polygons": [[(258, 98), (266, 110), (270, 125), (272, 200), (273, 330),
                                          (245, 330), (246, 200), (247, 125), (250, 110)]]},
    ],
    "coins": [{"category_id": 94, "polygons": [ellipse(x, y, r)]} for x, y, r in _COINS_TOP]
    + [{"category_id": 94, "crowd": True,
        "polygons": [ellipse(x, y, r) for x, y, r in _COINS_BOTTOM]}],
    "camera": [
        {"category_id": 1, "polygons": [[(200, 68), (245, 72), (268, 100), (265, 150), (250, 185),
                                         (300, 178), (332, 172), (332, 215), (285, 245), (250, 255),
                                         (215, 300), (160, 330), (140, 400), (150, 512), (0, 512),
                                         (0, 245), (40, 200), (100, 150), (130, 110), (165, 95)]]},
        {"category_id": 100, "polygons": [[(258, 140), (322, 140), (325, 190), (262, 195)]]},
        {"category_id": 101, "polygons": [[(285, 200), (300, 200), (305, 305), (335, 325),
                                           (408, 500), (398, 512), (230, 512), (228, 495),
                                           (275, 330), (285, 310)]]},
    ],
}

#: (photo, file name, crop box (x0, y0, x1, y1) in photo pixels, mirrored?)
CROPS: list[tuple[str, str, tuple[int, int, int, int], bool]] = [
    ("astronaut", "crops/astronaut_face.jpg", (120, 0, 330, 220), False),
    ("astronaut", "crops/astronaut_flip.jpg", (0, 0, 512, 512), True),
    ("astronaut", "crops/astronaut_right.jpg", (250, 0, 512, 400), False),
    ("astronaut", "crops/astronaut_flag.jpg", (0, 0, 200, 360), False),
    ("chelsea", "crops/chelsea_eyes.jpg", (100, 50, 380, 200), True),
    ("chelsea", "crops/chelsea_face.jpg", (60, 0, 420, 300), False),
    ("chelsea", "crops/chelsea_flip.jpg", (0, 0, 451, 300), True),
    ("coffee", "crops/coffee_cup.jpg", (120, 0, 400, 280), False),
    ("coffee", "crops/coffee_flip.jpg", (0, 0, 512, 341), True),
    ("coffee", "crops/coffee_spoon.jpg", (240, 30, 420, 300), False),
    ("rocket", "space/rocket_crop.jpg", (180, 60, 340, 342), True),
    ("coins", "crops/coins_top.jpg", (0, 0, 384, 160), False),
    ("coins", "crops/coins_bottom.jpg", (0, 150, 384, 303), True),
    ("coins", "crops/coins_left.jpg", (0, 0, 200, 303), False),
    ("camera", "crops/camera_head.jpg", (120, 40, 360, 260), False),
    ("camera", "crops/camera_flip.jpg", (0, 0, 512, 512), True),
    ("camera", "crops/camera_tripod.jpg", (200, 150, 450, 512), False),
]
