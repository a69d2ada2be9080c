/* fourfold: 4D hybrid-parallel training of transformer language models.
 * The umbrella header; include this one. */
#ifndef FOURFOLD_H
#define FOURFOLD_H

#define FF_VERSION_MAJOR  0
#define FF_VERSION_MINOR  1
#define FF_VERSION_PATCH  0
#define FF_VERSION_STRING "0.1.0"

#include "fourfold/bpe.h"
#include "fourfold/comm.h"
#include "fourfold/ctx.h"
#include "fourfold/data.h"
#include "fourfold/gemm.h"
#include "fourfold/gpt.h"
#include "fourfold/grid.h"
#include "fourfold/layerplan.h"
#include "fourfold/linear.h"
#include "fourfold/plan.h"
#include "fourfold/prune.h"
#include "fourfold/rng.h"
#include "fourfold/trace.h"
#include "fourfold/train.h"
#include "fourfold/trainer.h"

#endif
