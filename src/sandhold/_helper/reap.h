/* An exec's reaper for the in-sandbox agent: see reap.c. */
#ifndef SANDHOLD_REAP_H
#define SANDHOLD_REAP_H

/* sandhold-exec --reap ...: the process's whole life; returns its exit code. */
int reap_main(int argc, char **argv);

#endif
