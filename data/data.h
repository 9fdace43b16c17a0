// tg::data in one include: TensorDataset, DataLoader, and the .npy reader and writer (tg::load_npy / tg::save_npy).
#pragma once
#include <tapegrad/data/dataloader.h>
#include <tapegrad/data/dataset.h>
#include <tapegrad/data/npy.h>
