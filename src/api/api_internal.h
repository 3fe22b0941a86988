/* api_internal.h — what the public-API files share among themselves. */
#pragma once

#include "loom.h"

const loom_model *loom__session_model(const loom_session *s);
