# Search-R1's own retrieval client, vendored verbatim for the protocol tests.
#
# From https://github.com/PeterGriffinJin/Search-R1, file search_r1/llm_agent/generation.py,
# commit a14dc3a4ffc6fe88c1e95038d9738e21ba3f7a06:
# the methods of LLMGenerationManager that talk to the retrieval server
# (batch_search, _batch_search, _passages2string) and the GenerationConfig fields they read.
# Copyright (c) the Search-R1 authors. Licensed under the Apache License, Version 2.0
# (http://www.apache.org/licenses/LICENSE-2.0); distributed on an "AS IS" BASIS, WITHOUT
# WARRANTIES OR CONDITIONS OF ANY KIND.
# Changes: only these pieces are kept; the GenerationConfig fields the search does not read, and
# LLMGenerationManager's constructor arguments other than config (tokenizer, workers: torch and
# verl), are left out, and the imports are those the kept code uses. The method bodies are
# unchanged.
# ruff: noqa  (upstream's code as upstream wrote it)

from typing import List
from dataclasses import dataclass
import requests

@dataclass
class GenerationConfig:
    search_url: str = None
    topk: int = 3

class LLMGenerationManager:
    def __init__(self, config: GenerationConfig):
        self.config = config

    def batch_search(self, queries: List[str] = None) -> str:
        """
        Batchified search for queries.
        Args:
            queries: queries to call the search engine
        Returns:
            search results which is concatenated into a string
        """
        results = self._batch_search(queries)['result']
        
        return [self._passages2string(result) for result in results]

    def _batch_search(self, queries):
        
        payload = {
            "queries": queries,
            "topk": self.config.topk,
            "return_scores": True
        }
        
        return requests.post(self.config.search_url, json=payload).json()

    def _passages2string(self, retrieval_result):
        format_reference = ''
        for idx, doc_item in enumerate(retrieval_result):
            
            content = doc_item['document']['contents']
            title = content.split("\n")[0]
            text = "\n".join(content.split("\n")[1:])
            format_reference += f"Doc {idx+1}(Title: {title}) {text}\n"

        return format_reference
