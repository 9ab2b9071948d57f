/* space-agent internals shared by agent.c (the channel and commands) and agent_files.c (file
 * operations). Single-threaded: everything runs on the agent's one poll loop. */
#ifndef SPACE_AGENT_FILES_H
#define SPACE_AGENT_FILES_H

#include <stdbool.h>

#include "agent.pb-c.h"

/* Queues one frame for the worker (agent.c). */
void agent_send_frame(const Space__Agent__V1__AgentFrame *f);

/* Carries out a file frame (FileRequest, FileWrite, FileRead) and queues its replies. False
 * when f is not a file frame. */
bool agent_files_handle(const Space__Agent__V1__AgentFrame *f);

#endif
